package main

import (
	"context"
	"fmt"
	"github.com/durallm/durallm/providers/routes"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	sdklog "go.temporal.io/sdk/log"

	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/resultstore"
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
	logger := slog.New(slog.NewTextHandler(stderr, nil))
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
		Telemetry: tel, MetricsAddr: *metricsAddr, Results: resultstore.Dir{Path: cf.resultDir},
		AllowH2C: *allowH2C, ProbeRoutes: true, StreamAddr: *streamAddr, Journal: journalFrom(*journalDir), StreamToken: os.Getenv("DURALLM_STREAM_TOKEN"),
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

// journalFrom is the file-system journal in dir, or none for "".
func journalFrom(dir string) journal.Journal {
	if dir == "" {
		return nil
	}
	return journal.Dir{Path: dir}
}
