//go:build !nodev

package main

import (
	"context"
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
	"syscall"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/codec"
	demonstration "github.com/durallm/durallm/internal/demo"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
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
	gatewayAddr := fs.String("gateway-addr", defaultGatewayAddr, "serve the OpenAI-compatible API (/v1/chat/completions) here (empty: off; port 0: any free port)")
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
	copts.Logger = quietLogger(stderr)
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

	// The payload keyring, when on, encrypts the journal and the results
	// too.
	results := resultstore.Dir{Path: filepath.Join(*dataDir, "results"), Keys: keys}
	// An http:// route speaks HTTP/1.1 (auto), as local model servers
	// do; a route to a cleartext HTTP/2 server (the standalone demo
	// provider's h2c port) says http_version: "2".
	// Pollers and eager start as measured best for the embedded server
	// (BenchmarkEmbeddedServerTuning, docs/performance.md).
	opts := worker.Options{TaskQueue: *taskQueue, SearchAttributes: true, Logger: logger, Telemetry: tel, MetricsAddr: *metricsAddr, StreamAddr: *streamAddr, Journal: journal.Dir{Path: filepath.Join(*dataDir, "journal"), Keys: keys, Bound: &journal.Bound{MaxBytes: defaultJournalMaxBytes}}, StreamToken: os.Getenv("DURALLM_STREAM_TOKEN"), Results: results, ProbeRoutes: true,
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
		// A request that declares tools gets one tool call, then an answer,
		// so an agent runs against the demo (examples/agent).
		demo.SetDefault(providertest.AnswerOrCallTool("ok"))
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
	if *gatewayAddr != "" {
		c := durallm.NewClient(tc, *taskQueue).WithResults(results).WithEagerStart().WithDataConverter(copts.DataConverter)
		gw, models, tokenFile, err := devGateway(*gatewayAddr, *dataDir, c, w.Streams(), opts.Config.Names(), demo != nil, logger)
		if err != nil {
			fmt.Fprintf(stderr, "durallm dev: %v\n", err)
			return exitError
		}
		defer gw.Close()
		say("  · OpenAI-compatible gateway at %s (models: %s)", gw.URL(), models)
		say("    export OPENAI_BASE_URL=%s OPENAI_API_KEY=$(cat %s)", gw.URL(), tokenFile)
		say(`    curl -sN $OPENAI_BASE_URL/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" -H 'Idempotency-Key: demo-1' --json '{"model":"%s","stream":true,"messages":[{"role":"user","content":"hi"}]}'`, strings.Split(models, ", ")[0])
	}
	if srv.UIURL() != "" {
		say("\nTemporal UI: %s", srv.UIURL())
	}

	code := exitOK
	if demo != nil && !*noDemo {
		if err := demonstration.Run(ctx, stdout, durallm.NewClient(tc, *taskQueue).WithResults(results).WithEagerStart(), demo, demonstration.Options{Routes: []string{"demo-primary", "demo-fallback"}, Frontend: srv.FrontendHostPort(), WorkflowURL: srv.WorkflowURL}); err != nil {
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
