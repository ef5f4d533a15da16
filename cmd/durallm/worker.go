package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/resultstore"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/worker"
)

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
	streamURL := fs.String("stream-url", os.Getenv("DURALLM_STREAM_URL"), "where other processes reach --stream-addr (http://host:port), advertised in streamed attempts' heartbeats so a gateway elsewhere finds their streams (empty: http:// and --stream-addr unless its host is 0.0.0.0 or ::; -: none)")
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
	ctx, stop := signal.NotifyContext(workerContext(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	st, err := openStack(ctx, stackSetup{
		Logger: logger, Stderr: stderr, Keys: keys,
		DSN: cf.journalDSN, JournalDir: *journalDir, ResultDir: cf.resultDir,
		Bound: &journal.Bound{MaxBytes: int64(maxBytes), MaxEntries: *maxEntries},
		Dial: func(ctx context.Context, tel *telemetry.Telemetry, dc converter.DataConverter) (client.Client, error) {
			return dialUntilReachable(ctx, &cf, tel, dc, logger)
		},
	})
	if err != nil {
		fmt.Fprintf(stderr, "durallm worker: %v\n", err)
		return exitError
	}
	defer st.Close()
	w, err := st.newWorker(worker.Options{
		TaskQueue: cf.taskQueue, Config: cfg, SearchAttributes: *searchAttrs,
		StopTimeout: *stopTimeout, MaxConcurrentAttempts: *maxAttempts,
		MetricsAddr: *metricsAddr, AllowH2C: *allowH2C, StreamAddr: *streamAddr, StreamURL: *streamURL,
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
