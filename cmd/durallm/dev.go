//go:build !nodev

package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/durallm/durallm/providers/routes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providertest"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// devContext is the context 'dev' runs under until a signal; tests replace
// it to stop a running 'dev'.
var devContext = context.Background

func runDev(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("dev", "[flags]", stderr)
	dataDir := fs.String("data-dir", ".durallm", "where the embedded server keeps its SQLite database (actions survive restarts)")
	host := fs.String("host", devserver.DefaultHost, "address to bind; loopback by default")
	port := fs.Int("port", devserver.DefaultFrontendPort, "Temporal frontend port (-1: any free port)")
	uiPort := fs.Int("ui-port", 0, "Web UI port (0: port+1000; -1: any free port)")
	headless := fs.Bool("headless", false, "do not start the Web UI")
	routesFile := fs.String("routes", os.Getenv("DURALLM_ROUTES"), "routes YAML file; without it, the built-in fault-injecting demo provider serves two demo routes")
	noDemo := fs.Bool("no-demo", false, "do not run the demonstration")
	exitAfter := fs.Bool("exit-after-demo", false, "stop once the demonstration is done (for scripts and tests)")
	taskQueue := fs.String("task-queue", durallm.DefaultTaskQueue, "task queue")
	verbose := fs.Bool("v", false, "log every attempt event (llm.attempt) and server warnings")
	encKey := fs.String("encryption-key", os.Getenv("DURALLM_ENCRYPTION_KEY"), encryptionKeyHelp+"; the UI decodes through an in-process codec server")
	metricsAddr := fs.String("metrics-addr", "127.0.0.1:9090", "serve /metrics, /healthz and /readyz here (empty: off; port 0: any free port)")
	streamAddr := fs.String("stream-addr", "127.0.0.1:9092", "serve streamed actions' text as server-sent events at /v1/streams/{id} here (empty: off; port 0: any free port)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *routesFile == "" && *noDemo && *exitAfter {
		fmt.Fprintln(stderr, "durallm dev: --no-demo with --exit-after-demo would do nothing")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(devContext(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	say := func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }

	level := slog.LevelError
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	keys, err := loadKeyring(*encKey, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "durallm dev: %v\n", err)
		return exitUsage
	}
	var codecEndpoint string
	var codecHandler lateHandler
	if keys != nil {
		ln, err := net.Listen("tcp", net.JoinHostPort(*host, "0"))
		if err != nil {
			fmt.Fprintf(stderr, "durallm dev: codec server: %v\n", err)
			return exitError
		}
		cs := &http.Server{Handler: &codecHandler, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = cs.Serve(ln) }()
		defer cs.Close()
		codecEndpoint = "http://" + ln.Addr().String()
	}

	abs, _ := filepath.Abs(*dataDir)
	say("durallm dev: starting the embedded Temporal server (data in %s)", abs)
	started := time.Now()
	srv, err := devserver.Start(ctx, devserver.Options{
		DataDir: *dataDir, Host: *host, FrontendPort: *port, UIPort: *uiPort, DisableUI: *headless, CodecEndpoint: codecEndpoint,
		SearchAttributes: workflows.SearchAttributes, Logger: logger,
		Progress: func(step string) { say("  · %s", step) },
	})
	if err != nil {
		fmt.Fprintf(stderr, "durallm dev: %v\n", err)
		return exitError
	}
	defer func() {
		say("durallm dev: stopping the server")
		if err := srv.Stop(); err != nil {
			fmt.Fprintf(stderr, "durallm dev: stop: %v\n", err)
		}
	}()
	say("  · server ready at %s in %s", srv.FrontendHostPort(), time.Since(started).Round(100*time.Millisecond))

	if keys != nil {
		var origins []string
		if srv.UIURL() != "" {
			origins = []string{srv.UIURL()}
		}
		h := codec.Handler(keys, codec.HandlerOptions{AllowedOrigins: origins})
		codecHandler.h.Store(&h)
		say("  · payloads encrypted (AES-256-GCM, key %s); the UI decodes through %s", keys.ActiveKeyID(), codecEndpoint)
	}
	tel, err := telemetry.NewWithOptions(telemetry.Options{Logger: logger, OTLP: telemetry.OTLPConfigured()})
	if err != nil {
		fmt.Fprintf(stderr, "durallm dev: %v\n", err)
		return exitError
	}
	defer tel.Shutdown(context.Background())
	copts := srv.ClientOptions() // no gzip on loopback
	copts.Logger = quietLogger()
	if err := instrument(&copts, tel); err != nil {
		fmt.Fprintf(stderr, "durallm dev: %v\n", err)
		return exitError
	}
	if keys != nil {
		copts.DataConverter = codec.DataConverter(keys)
	}
	tc, err := client.Dial(copts)
	if err != nil {
		fmt.Fprintf(stderr, "durallm dev: connect to the embedded server: %v\n", err)
		return exitError
	}
	defer tc.Close()

	results := resultstore.Dir{Path: filepath.Join(*dataDir, "results")}
	// dev is a local tool: an http:// route (a local model server, the
	// standalone demo provider) may speak cleartext HTTP/2.
	// Pollers and eager start as measured best for the embedded server
	// (BenchmarkEmbeddedServerTuning, docs/performance.md).
	opts := worker.Options{TaskQueue: *taskQueue, SearchAttributes: true, Logger: logger, Telemetry: tel, MetricsAddr: *metricsAddr, StreamAddr: *streamAddr, Journal: journal.Dir{Path: filepath.Join(*dataDir, "journal")}, StreamToken: os.Getenv("DURALLM_STREAM_TOKEN"), Results: results, AllowH2C: true,
		WorkflowPollers: 8, ActivityPollers: 8}
	var demo *providertest.Provider
	if *routesFile != "" {
		cfg, err := routes.LoadConfig(*routesFile, os.Getenv)
		if err != nil {
			fmt.Fprintf(stderr, "durallm dev: %v\n", err)
			return exitUsage
		}
		opts.Config = cfg
		say("  · routes from %s: %s", *routesFile, strings.Join(cfg.Names(), ", "))
	} else {
		demo, err = providertest.NewProvider(providertest.WithModel("demo-model"))
		if err != nil {
			fmt.Fprintf(stderr, "durallm dev: demo provider: %v\n", err)
			return exitError
		}
		defer demo.Close()
		opts.Config = demoRoutes(demo.URL())
		opts.TLS = demo.ClientTLSConfig()
		say("  · demo provider (fault-injecting HTTP/2 over loopback TLS) at %s: routes demo-primary, demo-fallback", demo.URL())
	}
	w, err := worker.New(tc, opts)
	if err != nil {
		fmt.Fprintf(stderr, "durallm dev: %v\n", err)
		return exitUsage
	}
	if err := w.Start(); err != nil {
		fmt.Fprintf(stderr, "durallm dev: %v\n", err)
		return exitError
	}
	defer w.Stop()
	say("  · worker polling task queue %q", *taskQueue)
	if a := w.MetricsAddr(); a != "" {
		say("  · metrics at http://%s/metrics (health: /healthz, /readyz)", a)
	}
	if a := w.StreamAddr(); a != "" {
		say("  · streamed text at http://%s/v1/streams/{action id} (server-sent events)", a)
	}
	if srv.UIURL() != "" {
		say("\nTemporal UI: %s", srv.UIURL())
	}

	code := exitOK
	if demo != nil && !*noDemo {
		if err := demonstrate(ctx, stdout, srv, durallm.NewClient(tc, *taskQueue).WithResults(results).WithEagerStart(), demo); err != nil {
			fmt.Fprintf(stderr, "durallm dev: demonstration: %v\n", err)
			code = exitError
		}
	}
	if *exitAfter {
		return code
	}
	say("\nRunning. Start actions with 'durallm run --route demo-primary,demo-fallback --message hi'. Ctrl-C stops.")
	<-ctx.Done()
	say("\ndurallm dev: shutting down (in-flight attempts get a bounded grace)")
	return code
}

func demoRoutes(base string) routes.Config {
	caps := providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true}
	return routes.Config{Routes: []routes.Route{
		{Name: "demo-primary", Kind: routes.KindOpenAI, BaseURL: base + "/v1", Model: "demo-primary-model", Capabilities: caps},
		{Name: "demo-fallback", Kind: routes.KindOpenAI, BaseURL: base + "/v1", Model: "demo-fallback-model", Capabilities: caps},
	}}
}

// demoCase is one action of the demonstration: what the provider does to
// its first request, and what the action should end as.
type demoCase struct {
	name  string
	first func() providertest.Behavior // nil: answer normally
	want  workflows.State
	note  string
}

var demoCases = []demoCase{
	{"happy", nil, workflows.StateCompleted, "answered on the first attempt"},
	{"goaway", func() providertest.Behavior { return providertest.GoAwayAbove(http2.ErrCodeNo) }, workflows.StateCompleted, "GOAWAY above the boundary: provably unprocessed, resent on a fresh connection, executed once"},
	{"misdirected", providertest.Misdirected, workflows.StateCompleted, "421: connection quarantined, retried on a fresh one"},
	{"ambiguous", func() providertest.Behavior { return providertest.GoAwayAfterProcessing(http2.ErrCodeNo) }, workflows.StateAwaitingReconciliation, "GOAWAY at the boundary: maybe processed, so not resent; waits for your verdict"},
	{"canceled", providertest.Hold, workflows.StateCanceled, "canceled by user_stop while the provider was generating"},
}

// demonstrate runs the demo actions one after another, so each fault is
// easy to find in the UI, and prints what happened to each.
func demonstrate(ctx context.Context, out io.Writer, srv *devserver.Server, c *durallm.Client, p *providertest.Provider) error {
	prefix := "demo-" + time.Now().Format("150405")
	var mu sync.Mutex
	seen := map[string]bool{}
	byKey := map[string]demoCase{}
	for _, dc := range demoCases {
		byKey[prefix+"-"+dc.name] = dc
	}
	p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		defer mu.Unlock()
		dc, ok := byKey[r.IdempotencyKey]
		if !ok || dc.first == nil || seen[r.IdempotencyKey] {
			return providertest.Behavior{}, false
		}
		seen[r.IdempotencyKey] = true
		return dc.first(), true
	})
	fmt.Fprintf(out, "\nDemonstration (%d actions):\n", len(demoCases))
	var ambiguous string
	for _, dc := range demoCases {
		id := prefix + "-" + dc.name
		st, err := runDemoCase(ctx, c, p, id, dc)
		if err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		mark := "ok"
		if st.State != dc.want {
			mark = "UNEXPECTED"
		}
		fmt.Fprintf(out, "\n  [%s] %s → %s: %s\n", mark, id, st.State, dc.note)
		for _, a := range st.Attempts {
			fmt.Fprintf(out, "        %s → %s (%s)\n", a.Summary, a.Classification.Class, a.Classification.Reason)
		}
		if u := srv.WorkflowURL(id); u != "" {
			fmt.Fprintf(out, "        %s\n", u)
		}
		if st.State != dc.want {
			return fmt.Errorf("%s ended %s, expected %s", id, st.State, dc.want)
		}
		if dc.want == workflows.StateAwaitingReconciliation {
			ambiguous = id
		}
	}
	if ambiguous != "" {
		fmt.Fprintf(out, "\n%s awaits your verdict. Resolve it with:\n", ambiguous)
		fmt.Fprintf(out, "  durallm reconcile --address %s --id %s --attempt 1 --verdict completed --text \"the answer, from the provider's log\"\n", srv.FrontendHostPort(), ambiguous)
		fmt.Fprintf(out, "or with the temporal CLI:\n")
		fmt.Fprintf(out, "  temporal workflow update execute --address %s --workflow-id %s --name reconcile --input '{\"attempt\":1,\"verdict\":\"not_executed\"}'\n", srv.FrontendHostPort(), ambiguous)
		fmt.Fprintf(out, "All actions awaiting a verdict: durallm list --address %s --state awaiting_reconciliation\n", srv.FrontendHostPort())
	}
	return nil
}

func runDemoCase(ctx context.Context, c *durallm.Client, p *providertest.Provider, id string, dc demoCase) (workflows.Status, error) {
	in := workflows.ActionInput{
		Request:  providers.Request{Messages: []providers.Message{providers.TextMessage("user", "Say hello to the demo.")}},
		Routes:   []string{"demo-primary", "demo-fallback"},
		Deadline: 2 * time.Minute,
	}
	act, err := c.Start(ctx, id, in)
	if err != nil {
		return workflows.Status{}, err
	}
	switch dc.want {
	case workflows.StateCanceled:
		if err := waitUntil(ctx, func() bool { return p.ExecutedCount(id) > 0 }); err != nil {
			return workflows.Status{}, err
		}
		if err := c.Cancel(ctx, id, workflows.OriginUserStop, "demo: the user pressed stop"); err != nil {
			return workflows.Status{}, err
		}
	case workflows.StateAwaitingReconciliation:
		var st workflows.Status
		err := waitUntil(ctx, func() bool {
			st, _ = c.Status(ctx, id)
			return st.State == workflows.StateAwaitingReconciliation || st.State.Terminal()
		})
		return st, err
	}
	res, err := act.Result(ctx)
	var ae *durallm.ActionError
	if err != nil && !errors.As(err, &ae) {
		return workflows.Status{}, err
	}
	return res.Status, nil
}

func waitUntil(ctx context.Context, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting: %w", context.Cause(ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
