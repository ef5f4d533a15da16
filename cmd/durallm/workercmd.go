package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/durallm/durallm/providers/routes"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	sdklog "go.temporal.io/sdk/log"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/resultstore/pgstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/worker"
)

// quietLogger keeps the Temporal SDK's own chatter to warnings and errors.
func quietLogger() sdklog.Logger {
	return sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

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
	allowH2C := fs.Bool("allow-h2c", false, "let http:// routes speak cleartext HTTP/2 (a provider on a private network, such as the compose demo provider)")
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
	jr, results, closeStores, err := openStores(cf.journalDSN, *journalDir, cf.resultDir, keys)
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
	tc, err := cf.dialWith(tel)
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitError
	}
	defer tc.Close()
	w, err := worker.New(tc, worker.Options{
		TaskQueue: cf.taskQueue, Config: cfg, SearchAttributes: *searchAttrs,
		StopTimeout: *stopTimeout, MaxConcurrentAttempts: *maxAttempts, Logger: logger,
		Telemetry: tel, MetricsAddr: *metricsAddr, Results: results,
		AllowH2C: *allowH2C, StreamAddr: *streamAddr, Journal: jr, StreamToken: os.Getenv("DURALLM_STREAM_TOKEN"),
		WorkflowPollers: *pollers, ActivityPollers: *pollers,
	})
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := w.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitError
	}
	return exitOK
}

// openStores opens the attempt journal and the result store: both in the
// PostgreSQL database dsn names, creating and migrating it, when dsn is
// set; otherwise the directories (no journal for an empty journalDir).
// With keys, both encrypt what they store. It fails, naming the address, when the database cannot be reached: a
// worker without the journal its operator asked for would leave every
// ambiguous attempt to a person.
func openStores(dsn, journalDir, resultDir string, keys *codec.Keyring) (journal.Journal, resultstore.Store, func(), error) {
	if dsn == "" {
		var j journal.Journal
		if journalDir != "" {
			j = journal.Dir{Path: journalDir, Keys: keys}
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
	j.Keys, rs.Keys = keys, keys
	return j, rs, func() { j.Close(); rs.Close() }, nil
}

// isSet reports whether the flag was given on the command line.
func isSet(fs *flag.FlagSet, name string) (set bool) {
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
