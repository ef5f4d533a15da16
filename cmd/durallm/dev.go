//go:build !nodev

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
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

	"github.com/durallm/durallm/providers/routes"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/claimcheck"
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

// devFlags are 'dev”s flags.
type devFlags struct {
	dataDir, host, routesFile, taskQueue, encKey string
	metricsAddr, streamAddr, gatewayAddr         string
	port, uiPort                                 int
	headless, noDemo, exitAfter, verbose         bool
}

func (f *devFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dataDir, "data-dir", ".durallm", "where the embedded server keeps its SQLite database (actions survive restarts)")
	fs.StringVar(&f.host, "host", devserver.DefaultHost, "address to bind; loopback by default")
	fs.IntVar(&f.port, "port", devserver.DefaultFrontendPort, "Temporal frontend port (-1: any free port)")
	fs.IntVar(&f.uiPort, "ui-port", 0, "Web UI port (0: port+1000; -1: any free port)")
	fs.BoolVar(&f.headless, "headless", false, "do not start the Web UI")
	fs.StringVar(&f.routesFile, "routes", os.Getenv("DURALLM_ROUTES"), "routes YAML file; without it, the built-in fault-injecting demo provider serves two demo routes")
	fs.BoolVar(&f.noDemo, "no-demo", false, "do not run the demonstration")
	fs.BoolVar(&f.exitAfter, "exit-after-demo", false, "stop once the demonstration is done (for scripts and tests)")
	fs.StringVar(&f.taskQueue, "task-queue", durallm.DefaultTaskQueue, "task queue")
	fs.BoolVar(&f.verbose, "v", false, "log every attempt event (llm.attempt) and server warnings")
	fs.StringVar(&f.encKey, "encryption-key", os.Getenv("DURALLM_ENCRYPTION_KEY"), encryptionKeyHelp+"; the UI decodes through an in-process codec server")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "127.0.0.1:9090", "serve /metrics, /healthz and /readyz here (empty: off; port 0: any free port)")
	fs.StringVar(&f.streamAddr, "stream-addr", "127.0.0.1:9092", "serve streamed actions' text as server-sent events at /v1/streams/{id} here (empty: off; port 0: any free port)")
	fs.StringVar(&f.gatewayAddr, "gateway-addr", defaultGatewayAddr, "serve the gateway (OpenAI chat completions at /v1/chat/completions, OpenAI Responses at /v1/responses, Anthropic Messages at /v1/messages) here (empty: off; port 0: any free port)")
}

// devProcess is one 'dev': what it started so far, closed in reverse by close.
type devProcess struct {
	f              devFlags
	stdout, stderr io.Writer
	logger         *slog.Logger
	keys           *codec.Keyring
	srv            *devserver.Server
	st             *workerStack
	w              *worker.Worker
	demo           *providertest.Provider
	routes         routes.Config
	closers        []func()
}

func (d *devProcess) say(format string, a ...any) { fmt.Fprintf(d.stdout, format+"\n", a...) }

func (d *devProcess) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// failed reports an error of a start phase with the exit code it means.
type failed struct {
	code int
	err  error
}

func (e failed) Error() string { return e.err.Error() }

func runDev(args []string, stdout, stderr io.Writer) int {
	d := &devProcess{stdout: stdout, stderr: stderr}
	fs := newFlags("dev", "[flags]", stderr)
	d.f.register(fs)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if d.f.routesFile == "" && d.f.noDemo && d.f.exitAfter {
		fmt.Fprintln(stderr, "durallm dev: --no-demo with --exit-after-demo would do nothing")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(devContext(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer d.close()
	for _, phase := range []func(context.Context) error{d.startServer, d.startWorker, d.startGateway} {
		if err := phase(ctx); err != nil {
			fmt.Fprintf(stderr, "durallm dev: %v\n", err)
			var f failed
			if errors.As(err, &f) {
				return f.code
			}
			return exitError
		}
	}
	if d.srv.UIURL() != "" {
		d.say("\nTemporal UI: %s", d.srv.UIURL())
	}
	code := exitOK
	if d.demo != nil && !d.f.noDemo {
		c := durallm.NewClient(d.st.tc, d.f.taskQueue).WithResults(d.st.results).WithDataConverter(d.st.dc).WithEagerStart()
		if err := demonstration.Run(ctx, stdout, c, d.demo, demonstration.Options{Routes: []string{"demo-primary", "demo-fallback"}, Frontend: d.srv.FrontendHostPort(), WorkflowURL: d.srv.WorkflowURL}); err != nil {
			fmt.Fprintf(stderr, "durallm dev: demonstration: %v\n", err)
			code = exitError
		}
	}
	if d.f.exitAfter {
		return code
	}
	d.say("\nRunning. Start actions with 'durallm run --route %s --message hi'. Ctrl-C stops.", strings.Join(d.routes.Names(), ","))
	<-ctx.Done()
	d.say("\ndurallm dev: shutting down (in-flight attempts get a bounded grace)")
	return code
}

// startServer starts the embedded Temporal server and its UI, with a
// codec server for the UI: it resolves the payloads kept by reference in
// the data directory's result store, and decrypts them when payloads are
// encrypted.
func (d *devProcess) startServer(ctx context.Context) error {
	level := slog.LevelError
	if d.f.verbose {
		level = slog.LevelInfo
	}
	d.logger = slog.New(slog.NewTextHandler(d.stderr, &slog.HandlerOptions{Level: level}))
	var err error
	if d.keys, err = loadKeyring(d.f.encKey, d.stderr); err != nil {
		return failed{exitUsage, err}
	}
	var codecHandler lateHandler
	ln, err := net.Listen("tcp", net.JoinHostPort(d.f.host, "0"))
	if err != nil {
		return fmt.Errorf("codec server: %w", err)
	}
	cs := &http.Server{Handler: &codecHandler, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = cs.Serve(ln) }()
	d.closers = append(d.closers, func() { cs.Close() })
	codecEndpoint := "http://" + ln.Addr().String()
	abs, _ := filepath.Abs(d.f.dataDir)
	d.say("durallm dev: starting the embedded Temporal server (data in %s)", abs)
	started := time.Now()
	if d.srv, err = devserver.Start(ctx, devserver.Options{
		DataDir: d.f.dataDir, Host: d.f.host, FrontendPort: d.f.port, UIPort: d.f.uiPort, DisableUI: d.f.headless, CodecEndpoint: codecEndpoint,
		SearchAttributes: workflows.SearchAttributes, Logger: d.logger,
		Progress: func(step string) { d.say("  · %s", step) },
	}); err != nil {
		return err
	}
	d.closers = append(d.closers, func() {
		d.say("durallm dev: stopping the server")
		if err := d.srv.Stop(); err != nil {
			fmt.Fprintf(d.stderr, "durallm dev: stop: %v\n", err)
		}
	})
	d.say("  · server ready at %s in %s", d.srv.FrontendHostPort(), time.Since(started).Round(100*time.Millisecond))
	var origins []string
	if d.srv.UIURL() != "" {
		origins = []string{d.srv.UIURL()}
	}
	refs := claimcheck.NewCodec(resultstore.Dir{Path: d.resultDir(), Keys: d.keys}, claimcheck.Options{})
	h := codec.Handler(d.keys, codec.HandlerOptions{AllowedOrigins: origins, References: refs})
	codecHandler.h.Store(&h)
	if d.keys != nil {
		d.say("  · payloads encrypted (AES-256-GCM, key %s); the UI decodes them through %s", d.keys.ActiveKeyID(), codecEndpoint)
	} else {
		d.say("  · payloads over 2 KiB kept by reference in %s; the UI reads them through %s", d.resultDir(), codecEndpoint)
	}
	return nil
}

// resultDir is the data directory's result store: responses and payloads
// kept by reference.
func (d *devProcess) resultDir() string { return filepath.Join(d.f.dataDir, "results") }

// startWorker opens the worker stack on the embedded server (journal and
// results in the data directory), the routes or the demo provider, and
// starts the worker.
func (d *devProcess) startWorker(ctx context.Context) error {
	var err error
	if d.st, err = openStack(ctx, stackSetup{
		Logger: d.logger, Stderr: d.stderr, Keys: d.keys,
		JournalDir: filepath.Join(d.f.dataDir, "journal"), ResultDir: d.resultDir(),
		Bound: &journal.Bound{MaxBytes: defaultJournalMaxBytes},
		Dial: func(_ context.Context, tel *telemetry.Telemetry, dc converter.DataConverter) (client.Client, error) {
			copts := d.srv.ClientOptions() // no gzip on loopback
			if err := finishClient(&copts, d.stderr, tel, dc); err != nil {
				return nil, err
			}
			tc, err := client.Dial(copts)
			if err != nil {
				return nil, fmt.Errorf("connect to the embedded server: %w", err)
			}
			return tc, nil
		},
	}); err != nil {
		return err
	}
	d.closers = append(d.closers, d.st.Close)
	// Pollers as measured best for the embedded server
	// (BenchmarkEmbeddedServerTuning, docs/performance.md). An http://
	// route speaks HTTP/1.1 (auto), as local model servers do; a route to
	// a cleartext HTTP/2 server says http_version: "2".
	opts := worker.Options{TaskQueue: d.f.taskQueue, SearchAttributes: true, MetricsAddr: d.f.metricsAddr, StreamAddr: d.f.streamAddr,
		WorkflowPollers: 8, ActivityPollers: 8}
	if d.f.routesFile != "" {
		if d.routes, err = routes.LoadConfig(d.f.routesFile, os.Getenv); err != nil {
			return failed{exitUsage, err}
		}
		d.say("  · routes from %s: %s", d.f.routesFile, strings.Join(d.routes.Names(), ", "))
	} else {
		if d.demo, err = providertest.NewProvider(providertest.WithModel("demo-model")); err != nil {
			return fmt.Errorf("demo provider: %w", err)
		}
		d.closers = append(d.closers, func() { d.demo.Close() })
		// A request that declares tools gets one tool call, then an answer,
		// so an agent runs against the demo (examples/agent).
		d.demo.SetDefault(providertest.AnswerOrCallTool("ok"))
		d.routes = demoRoutes(d.demo.URL())
		opts.TLS = d.demo.ClientTLSConfig()
		d.say("  · demo provider (fault-injecting HTTP/2 over loopback TLS) at %s: routes demo-primary, demo-fallback", d.demo.URL())
	}
	opts.Config = d.routes
	if d.w, err = d.st.newWorker(opts); err != nil {
		return failed{exitUsage, err}
	}
	if err := d.w.Start(); err != nil {
		return err
	}
	d.closers = append(d.closers, d.w.Stop)
	d.say("  · worker polling task queue %q", d.f.taskQueue)
	if a := d.w.MetricsAddr(); a != "" {
		d.say("  · metrics at http://%s/metrics (health: /healthz, /readyz)", a)
	}
	if a := d.w.StreamAddr(); a != "" {
		d.say("  · streamed text at http://%s/v1/streams/{action id} (server-sent events)", a)
	}
	return nil
}

// startGateway serves the OpenAI-compatible gateway on the worker's
// process and prints how to point an SDK at it.
func (d *devProcess) startGateway(context.Context) error {
	if d.f.gatewayAddr == "" {
		return nil
	}
	c := durallm.NewClient(d.st.tc, d.f.taskQueue).WithResults(d.st.results).WithDataConverter(d.st.dc).WithEagerStart()
	gw, models, tokenFile, err := devGateway(d.f.gatewayAddr, d.f.dataDir, c, d.w.Streams(), d.routes.Names(), d.demo != nil, d.logger, d.st.tel.Meter())
	if err != nil {
		return err
	}
	d.closers = append(d.closers, func() { gw.Close() })
	d.say("  · OpenAI-compatible gateway at %s (models: %s), Responses and Anthropic's Messages too", gw.URL(), models)
	d.say("    export OPENAI_BASE_URL=%s OPENAI_API_KEY=$(cat %s)", gw.URL(), tokenFile)
	d.say(`    curl -sN $OPENAI_BASE_URL/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" -H 'Idempotency-Key: demo-1' --json '{"model":"%s","stream":true,"messages":[{"role":"user","content":"hi"}]}'`, strings.Split(models, ", ")[0])
	d.say("    Anthropic's SDKs and Claude Code (POST /v1/messages): export ANTHROPIC_BASE_URL=%s ANTHROPIC_AUTH_TOKEN=$(cat %s) ANTHROPIC_MODEL=%s",
		strings.TrimSuffix(gw.URL(), "/v1"), tokenFile, strings.Split(models, ", ")[0])
	return nil
}

func demoRoutes(base string) routes.Config {
	caps := providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true}
	return routes.Config{Routes: []routes.Route{
		{Name: "demo-primary", Kind: routes.KindOpenAI, BaseURL: base + "/v1", Model: "demo-primary-model", Capabilities: caps},
		{Name: "demo-fallback", Kind: routes.KindOpenAI, BaseURL: base + "/v1", Model: "demo-fallback-model", Capabilities: caps},
	}}
}
