package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/durallm/durallm/providers/routes"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/resultstore/pgstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/worker"
)

// quietLogger keeps the Temporal SDK's own chatter, written to w, to
// warnings and errors, and withholds any result it logs
// (telemetry.TemporalLogger, which also logs a canceled activity, an
// expected outcome, below warnings).
func quietLogger(w io.Writer) sdklog.Logger {
	return telemetry.TemporalLogger(slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// workerContext is the context 'worker' runs under until a signal; tests
// replace it to stop a worker they run in-process.
var workerContext = context.Background

func runWorker(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("worker", "--routes FILE [flags]", stderr)
	var cf connFlags
	cf.register(fs)
	routesFile := fs.String("routes", os.Getenv("DURALLM_ROUTES"), "routes YAML file (see docs/providers.md); default $DURALLM_ROUTES")
	searchAttrs := fs.Bool("search-attributes", true, "write DurallmState/DurallmOutcome/DurallmRoute (the namespace must have them registered)")
	stopTimeout := fs.Duration("stop-timeout", 10*time.Second, "on SIGTERM, how long in-flight attempts get to finish before they are canceled")
	maxAttempts := fs.Int("max-concurrent-attempts", 256, "CallModel executions at once in this worker")
	metricsAddr := fs.String("metrics-addr", "127.0.0.1:9090", "serve /metrics, /healthz and /readyz here (empty: off)")
	streamAddr := fs.String("stream-addr", "127.0.0.1:9092", "serve the generated text of streamed actions as server-sent events at /v1/streams/{id} here (empty: off); beyond loopback it needs $DURALLM_STREAM_TOKEN")
	pollers := fs.Int("pollers", 0, "workflow and activity task pollers each (0: the SDK's default, 2; 8 measured best on the embedded server)")
	journalDir := fs.String("journal-dir", envOr("DURALLM_JOURNAL_DIR", "durallm-journal"), "the attempt journal: where each attempt's end is written before it is reported, read first to reconcile ambiguous attempts (every worker of the task queue must share it; empty: off)")
	retention := fs.Duration("journal-retention", journal.DefaultRetention, "how long a journal entry is kept after its action closed (entries of running actions are kept); negative: never expire")
	resultRetention := fs.Duration("result-retention", resultstore.DefaultRetention, "how long a stored result is kept after the last action it was stored for closed (results of running actions are kept); negative: never expire")
	maxBytes := byteSize(defaultJournalMaxBytes)
	fs.Var(&maxBytes, "journal-max-bytes", "the journal's size bound in stored bytes (KiB, MiB, GiB suffixes; 0: none): at the bound new attempts go unjournaled, nothing is dropped")
	maxEntries := fs.Int64("journal-max-entries", 0, "the journal's bound in entries (0: none)")
	allowH2C := fs.Bool("allow-h2c", false, "http:// routes with http_version auto speak cleartext HTTP/2 (h2c) instead of HTTP/1.1 (a provider on a private network, such as the compose demo provider)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *routesFile == "" {
		fmt.Fprintln(stderr, "durallm worker: --routes (or DURALLM_ROUTES) is required")
		return exitUsage
	}
	cfg, err := routes.LoadConfig(*routesFile, os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitUsage
	}
	if cf.journalDSN != "" {
		for _, dir := range []struct{ flag, env string }{{"journal-dir", "DURALLM_JOURNAL_DIR"}, {"result-dir", "DURALLM_RESULT_DIR"}} {
			if isSet(fs, dir.flag) || os.Getenv(dir.env) != "" {
				fmt.Fprintf(stderr, "durallm worker: --journal-dsn puts the journal and the result store in PostgreSQL, and --%s (or %s) is set too: set one\n", dir.flag, dir.env)
				return exitUsage
			}
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	cf.stderr = stderr
	keys, err := cf.keyring()
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitUsage
	}
	bound := &journal.Bound{MaxBytes: int64(maxBytes), MaxEntries: *maxEntries}
	jr, results, closeStores, err := openStores(cf.journalDSN, *journalDir, cf.resultDir, keys, bound)
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitError
	}
	defer closeStores()
	tel, err := telemetry.NewWithOptions(telemetry.Options{Logger: logger, OTLP: telemetry.OTLPConfigured()})
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitError
	}
	defer tel.Shutdown(context.Background())
	ctx, stop := signal.NotifyContext(workerContext(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tc, err := dialUntilReachable(ctx, &cf, tel, logger)
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitError
	}
	defer tc.Close()
	w, err := worker.New(tc, worker.Options{
		TaskQueue: cf.taskQueue, Config: cfg, SearchAttributes: *searchAttrs,
		StopTimeout: *stopTimeout, MaxConcurrentAttempts: *maxAttempts, Logger: logger,
		Telemetry: tel, MetricsAddr: *metricsAddr, Results: results,
		AllowH2C: *allowH2C, ProbeRoutes: true, StreamAddr: *streamAddr, Journal: jr, StreamToken: os.Getenv("DURALLM_STREAM_TOKEN"),
		WorkflowPollers: *pollers, ActivityPollers: *pollers, JournalRetention: *retention, ResultRetention: *resultRetention,
	})
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitUsage
	}
	if err := w.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitError
	}
	return exitOK
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

// isSet reports whether the flag was given on the command line.
func isSet(fs *flag.FlagSet, name string) (set bool) {
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// defaultJournalMaxBytes is the journal's default size bound: room for
// about a million typical entries.
const defaultJournalMaxBytes = 10 << 30

// byteSize is a flag of bytes, with an optional KiB, MiB or GiB suffix.
type byteSize int64

func (b *byteSize) String() string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if int64(*b) >= u.n && int64(*b)%u.n == 0 {
			return strconv.FormatInt(int64(*b)/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *byteSize) Set(s string) error {
	mult := int64(1)
	for suffix, n := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if v, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = v, n
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return fmt.Errorf("want a number of bytes, optionally with KiB, MiB or GiB")
	}
	*b = byteSize(n * mult)
	return nil
}

// Bounds of the wait between tries to reach Temporal at start.
const (
	firstRetry = time.Second
	maxRetry   = 15 * time.Second
)

// dialUntilReachable dials Temporal until it answers or ctx ends (SIGTERM,
// Ctrl-C). A worker started before its cluster, as a deploy that starts
// everything at once does, waits and says so on each try instead of
// exiting. Only an unreachable server is waited for: any other error
// (bad TLS or API-key settings, a refused credential) needs a person and
// ends the worker at once.
func dialUntilReachable(ctx context.Context, cf *connFlags, tel *telemetry.Telemetry, log *slog.Logger) (client.Client, error) {
	wait := firstRetry
	for try := 1; ; try++ {
		tc, err := cf.dialWith(ctx, tel)
		var unavailable *serviceerror.Unavailable
		switch {
		case err == nil:
			if try > 1 {
				log.Info("durallm worker: Temporal is reachable now", "tries", try)
			}
			return tc, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("stopped while waiting for Temporal: %w", err)
		case !errors.As(err, &unavailable):
			return nil, err
		}
		log.Warn("durallm worker: Temporal not reachable yet; retrying (the worker waits, it does not exit)", "error", err, "try", try, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stopped while waiting for Temporal: %w", err)
		case <-time.After(wait):
		}
		wait = min(2*wait, maxRetry)
	}
}
