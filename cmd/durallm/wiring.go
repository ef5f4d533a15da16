package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/resultstore/pgstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/worker"
)

// A process that runs a durallm worker ('dev', 'worker', 'gateway' with
// its worker) is assembled here, in one order: the journal and the result
// store, telemetry, the Temporal client, then the worker with the parts
// every durallm worker gets from its process. The commands differ only in
// where each part comes from (their flags, the embedded server).

// stackSetup says where a worker process's parts come from.
type stackSetup struct {
	// Logger receives the worker's events; Stderr the SDK's own lines.
	Logger *slog.Logger
	Stderr io.Writer
	// Keys, when set, encrypt history, the journal and stored results.
	Keys *codec.Keyring
	// The journal and the result store (openStores): in the PostgreSQL
	// database DSN names, else in the directories (an empty JournalDir
	// keeps no journal), the journal bounded by Bound. NoStores opens
	// neither, for a process that runs no worker: its payloads go through
	// Results (connFlags.results).
	DSN, JournalDir, ResultDir string
	Bound                      *journal.Bound
	NoStores                   bool
	Results                    resultstore.Store
	// Dial dials Temporal with dc; finishClient gives its options what
	// every durallm client has.
	Dial func(ctx context.Context, tel *telemetry.Telemetry, dc converter.DataConverter) (client.Client, error)
}

// workerStack is a worker process's parts, released by Close in reverse.
type workerStack struct {
	logger  *slog.Logger
	tel     *telemetry.Telemetry
	tc      client.Client
	journal journal.Journal
	results resultstore.Store
	// dc is the data converter the client was dialed with
	// (payloadConverter), for durallm.Client.WithDataConverter.
	dc      converter.DataConverter
	closers []func()
}

// openStack opens s's parts in order; on an error, those already open
// are closed again.
func openStack(ctx context.Context, s stackSetup) (_ *workerStack, err error) {
	st := &workerStack{logger: s.Logger}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	st.results = s.Results
	if !s.NoStores {
		j, r, closeStores, err := openStores(s.DSN, s.JournalDir, s.ResultDir, s.Keys, s.Bound)
		if err != nil {
			return nil, err
		}
		st.journal, st.results = j, r
		st.closers = append(st.closers, closeStores)
	}
	st.dc = payloadConverter(s.Keys, st.results, s.Stderr)
	if st.tel, err = telemetry.NewWithOptions(telemetry.Options{Logger: s.Logger, OTLP: telemetry.OTLPConfigured()}); err != nil {
		return nil, err
	}
	st.closers = append(st.closers, func() { _ = st.tel.Shutdown(context.Background()) })
	if st.tc, err = s.Dial(ctx, st.tel, st.dc); err != nil {
		return nil, err
	}
	st.closers = append(st.closers, st.tc.Close)
	return st, nil
}

// newWorker builds the worker: o, with what every durallm worker takes
// from its process (the logger, telemetry, journal and result store, the
// stream token from $DURALLM_STREAM_TOKEN) and its routes probed at start.
func (st *workerStack) newWorker(o worker.Options) (*worker.Worker, error) {
	o.Logger, o.Telemetry, o.Journal, o.Results = st.logger, st.tel, st.journal, st.results
	o.ProbeRoutes = true
	o.StreamToken = os.Getenv("DURALLM_STREAM_TOKEN")
	return worker.New(st.tc, o)
}

// Close releases the parts in reverse order.
func (st *workerStack) Close() {
	for i := len(st.closers) - 1; i >= 0; i-- {
		st.closers[i]()
	}
	st.closers = nil
}

// openStores opens the attempt journal and the result store: both in the
// PostgreSQL database dsn names, creating and migrating it, when dsn is
// set; otherwise the directories (no journal for an empty journalDir).
// With keys, both encrypt what they store; bound bounds the journal. It fails, naming the address, when the database cannot be reached: a
// worker without the journal its operator asked for would leave every
// ambiguous attempt to a person.
func openStores(dsn, journalDir, resultDir string, keys *codec.Keyring, bound *journal.Bound) (journal.Journal, resultstore.Store, func(), error) {
	if dsn == "" {
		var j journal.Journal
		if journalDir != "" {
			j = journal.Dir{Path: journalDir, Keys: keys, Bound: bound}
		}
		return j, resultstore.Dir{Path: resultDir, Keys: keys}, func() {}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	j, err := journal.OpenPostgres(ctx, dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	rs, err := pgstore.Open(ctx, dsn)
	if err != nil {
		j.Close()
		return nil, nil, nil, err
	}
	j.Keys, j.Bound, rs.Keys = keys, bound, keys
	return j, rs, func() { j.Close(); rs.Close() }, nil
}

// finishClient gives Temporal client options what every durallm client
// has: the SDK's logger writing to stderr (quietLogger), no gzip on
// loopback, the SDK's metrics and traces to tel, and dc, the data
// converter (payloadConverter).
func finishClient(opts *client.Options, stderr io.Writer, tel *telemetry.Telemetry, dc converter.DataConverter) error {
	opts.Logger = quietLogger(stderr)
	uncompressedOnLoopback(opts)
	if err := instrument(opts, tel); err != nil {
		return fmt.Errorf("telemetry for the Temporal client: %w", err)
	}
	opts.DataConverter = dc
	return nil
}

// payloadConverter is the data converter of every client the binary
// dials: payloads over 2 KiB kept in the result store by reference
// (claimcheck), every payload encrypted when keys are set. Its warnings
// (a payload kept inline because the store failed) go to stderr.
func payloadConverter(keys *codec.Keyring, results resultstore.Store, stderr io.Writer) converter.DataConverter {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return claimcheck.DataConverter(results, claimcheck.Options{Keys: keys, Logger: log})
}
