package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/gateway"
	"github.com/durallm/durallm/gateway/callerbudget"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/worker"
)

// gatewayContext is the context 'gateway' runs under until a signal;
// tests replace it to stop a running gateway.
var gatewayContext = context.Background

// defaultGatewayAddr is where 'gateway' and 'dev' serve the
// OpenAI-compatible API.
const defaultGatewayAddr = "127.0.0.1:9093"

func runGateway(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("gateway", "[--routes FILE] [--config FILE] [--tokens FILE] [flags]", stderr)
	var cf connFlags
	cf.register(fs)
	addr := fs.String("addr", defaultGatewayAddr, "serve the gateway here (/v1/chat/completions, /v1/messages, /v1/models, /v1/actions); beyond loopback it needs --tokens")
	configFile := fs.String("config", os.Getenv("DURALLM_GATEWAY_CONFIG"), "models YAML: each model a group of routes with its needs and action settings (docs/gateway.md); without it every route of --routes is a model of its own name")
	routesFile := fs.String("routes", os.Getenv("DURALLM_ROUTES"), "routes YAML of the worker this process runs (see docs/providers.md); default $DURALLM_ROUTES")
	runWorker := fs.Bool("worker", true, "run a worker in this process (needs --routes): first attempts run here and stream through its hub; false keeps provider keys off this host (needs --config)")
	tokensFile := fs.String("tokens", os.Getenv("DURALLM_GATEWAY_TOKENS"), "tokens YAML: one entry per caller (id, sha256 of the token, models, max_in_flight, role: operator, budget); reloaded when it changes and on SIGHUP; without it no authentication, loopback only")
	secretFile := fs.String("secret-file", envOr("DURALLM_GATEWAY_SECRET_FILE", "durallm-gateway-secret"), "the secret that keys request fingerprints (made, 32 random bytes, if missing); every gateway of a task queue must share it; $DURALLM_GATEWAY_SECRET holds it instead")
	metricsAddr := fs.String("metrics-addr", "127.0.0.1:9094", "serve /metrics, /healthz and /readyz here (empty: off)")
	streamAddr := fs.String("stream-addr", "", "the in-process worker serves its streams here for gateways in other processes (/v1/streams/{id}; empty: off; beyond loopback it needs $DURALLM_STREAM_TOKEN)")
	streamURL := fs.String("stream-url", os.Getenv("DURALLM_STREAM_URL"), "where other processes reach --stream-addr (as durallm worker's --stream-url)")
	journalDir := fs.String("journal-dir", envOr("DURALLM_JOURNAL_DIR", "durallm-journal"), "the in-process worker's attempt journal (every worker of the task queue must share it; empty: off)")
	searchAttrs := fs.Bool("search-attributes", true, "the in-process worker writes DurallmState/DurallmOutcome/DurallmRoute (the namespace must have them registered)")
	pollers := fs.Int("pollers", 0, "the in-process worker's workflow and activity task pollers each (0: the SDK's default, 2)")
	allowH2C := fs.Bool("allow-h2c", false, "http:// routes with http_version auto speak cleartext HTTP/2 (h2c) instead of HTTP/1.1")
	spendFile := fs.String("spend-file", envOr("DURALLM_SPEND_FILE", "durallm-spend.json"), "where the callers' budgets are kept without --journal-dsn (opened when a caller of --tokens has a budget): one gateway only; gateways that share budgets share --journal-dsn")
	verbose := fs.Bool("v", false, "log one line per request (never content, tokens or keys)")
	maxBody := byteSize(gateway.DefaultMaxBody)
	fs.Var(&maxBody, "max-request-bytes", "the largest request body (KiB, MiB, GiB suffixes): a larger one is a 413 request_too_large, refused before it is read whole; a request the result store cannot keep (32 MiB by default) is the same 413")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	fail := func(code int, format string, a ...any) int { return failWith(stderr, "gateway", code, format, a...) }
	if *runWorker && *routesFile == "" {
		return fail(exitUsage, "--routes (or DURALLM_ROUTES) is required to run a worker in this process; --worker=false serves without one")
	}
	if !*runWorker && *configFile == "" {
		return fail(exitUsage, "--worker=false needs --config: without a worker here the gateway cannot tell which routes exist")
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: requestLogLevel(*verbose)}))
	in, err := loadGatewayFiles(*routesFile, *configFile, *tokensFile, *secretFile, *addr, logger)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	cfg, models, tokens := in.routes, in.models, in.tokens
	if in.madeSecret {
		fmt.Fprintf(stdout, "durallm gateway: made a new fingerprint secret in %s: give every gateway of this task queue the same file\n", *secretFile)
	}
	cf.stderr = stderr
	keys, err := cf.keyring()
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	ctx, stop := signal.NotifyContext(gatewayContext(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	st, err := openStack(ctx, stackSetup{
		Logger: logger, Stderr: stderr, Keys: keys, NoStores: !*runWorker, Results: cf.results(),
		DSN: cf.journalDSN, JournalDir: *journalDir, ResultDir: cf.resultDir,
		Bound: &journal.Bound{MaxBytes: defaultJournalMaxBytes},
		Dial: func(ctx context.Context, tel *telemetry.Telemetry, dc converter.DataConverter) (client.Client, error) {
			return dialUntilReachable(ctx, &cf, tel, dc, logger)
		},
	})
	if err != nil {
		return fail(exitError, "%v", err)
	}
	defer st.Close()
	tel, tc := st.tel, st.tc
	c := cf.client(tc).WithResults(st.results).WithDataConverter(st.dc)
	// Attempts that run on workers in other processes stream from there.
	remote := &gateway.RemoteStreams{Token: os.Getenv("DURALLM_STREAM_TOKEN")}
	var hub *activities.Streams
	if *runWorker {
		hub = activities.NewStreams()
		w, err := st.newWorker(worker.Options{
			TaskQueue: cf.taskQueue, Config: cfg, SearchAttributes: *searchAttrs,
			MetricsAddr: *metricsAddr, AllowH2C: *allowH2C, Streams: hub,
			WorkflowPollers: *pollers, ActivityPollers: *pollers,
			StreamAddr: *streamAddr, StreamURL: *streamURL,
		})
		if err != nil {
			return fail(exitUsage, "%v", err)
		}
		if err := w.Start(); err != nil {
			return fail(exitError, "%v", err)
		}
		defer w.Stop()
		// The worker shares this process's Temporal client: the first
		// workflow task, and the first attempt, come back here.
		c.WithEagerStart()
		remote.Self = w.StreamURL()
	} else if *metricsAddr != "" {
		srv, err := serveMetrics(*metricsAddr, tel, tc)
		if err != nil {
			return fail(exitError, "%v", err)
		}
		defer srv.Close()
	}
	spend, err := openSpend(ctx, cf.journalDSN, *spendFile, tokens)
	if err != nil {
		return fail(exitError, "%v", err)
	}
	if spend != nil {
		defer spend.Close()
	}
	gw, err := startGateway(gatewaySetup{Addr: *addr, Client: c, Models: models, Tokens: tokens, Secret: in.secret, Streams: hub, Remote: remote, Logger: logger, Meter: tel.Meter(), MaxBody: int64(maxBody),
		Spend: spend, Routes: routeInfos(cfg)})
	if err != nil {
		return fail(exitError, "%v", err)
	}
	defer gw.Close()
	defer watchTokens(ctx, tokens)()
	fmt.Fprintf(stdout, "durallm gateway: OpenAI-compatible API at %s (models: %s)\n", gw.URL(), modelNames(models))
	<-ctx.Done()
	fmt.Fprintln(stdout, "durallm gateway: stopping")
	return exitOK
}

// checkGatewayAddr refuses an address beyond loopback without tokens: the
// API starts actions and returns their answers to whoever reaches it.
func checkGatewayAddr(addr string, haveTokens bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w", addr, err)
	}
	if haveTokens {
		return nil
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("--addr %s is not a loopback address and there is no --tokens file: anyone who reaches it could run and read actions; give it --tokens or listen on 127.0.0.1", addr)
}

// loadGatewaySecret reads the fingerprint secret: $DURALLM_GATEWAY_SECRET,
// else the file, made with 32 random bytes (hex) when missing. made says
// it was just made.
func loadGatewaySecret(path string) (secret []byte, made bool, err error) {
	if v := os.Getenv("DURALLM_GATEWAY_SECRET"); v != "" {
		if len(v) < 32 {
			return nil, false, errors.New("DURALLM_GATEWAY_SECRET must be at least 32 bytes")
		}
		return []byte(v), false, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		var r [32]byte
		_, _ = rand.Read(r[:])
		if err := writeNew(path, hex.EncodeToString(r[:])+"\n"); err != nil {
			return nil, false, fmt.Errorf("make the gateway secret %s: %w", path, err)
		}
		b, made = []byte(hex.EncodeToString(r[:])), true
	} else if err != nil {
		return nil, false, fmt.Errorf("gateway secret: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if len(s) < 32 {
		return nil, false, fmt.Errorf("gateway secret %s: want at least 32 bytes", path)
	}
	return []byte(s), made, nil
}

// writeNew writes a file that must not exist yet, readable by its owner
// only.
func writeNew(path, text string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// serveMetrics serves the telemetry endpoints for a gateway without a
// worker; ready is Temporal's health.
func serveMetrics(addr string, tel *telemetry.Telemetry, tc client.Client) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: tel.Handler(func(ctx context.Context) error {
		_, err := tc.CheckHealth(ctx, &client.CheckHealthRequest{})
		return err
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

func modelNames(c gateway.Config) string {
	names := make([]string, 0, len(c.Models))
	for _, m := range c.Models {
		names = append(names, m.Name)
	}
	return strings.Join(names, ", ")
}

// requestLogLevel is the gateway's log level: with -v, Debug, where its
// line per request is.
func requestLogLevel(verbose bool) slog.Level {
	if verbose {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// failWith says what went wrong with the command and returns code.
func failWith(stderr io.Writer, command string, code int, format string, a ...any) int {
	fmt.Fprintf(stderr, "durallm "+command+": "+format+"\n", a...)
	return code
}

// watchTokens reloads the tokens file when it changes and on SIGHUP,
// until the returned stop (a nil tokens watches nothing).
func watchTokens(ctx context.Context, tokens *gateway.Tokens) (stop func()) {
	if tokens == nil {
		return func() {}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go tokens.Watch(ctx, 2*time.Second, hup)
	return func() { signal.Stop(hup) }
}

// gatewayFiles is what 'gateway' reads before it serves: its worker's
// routes, the models, the callers' tokens and the fingerprint secret.
type gatewayFiles struct {
	routes     routes.Config
	models     gateway.Config
	tokens     *gateway.Tokens
	secret     []byte
	madeSecret bool
}

// loadGatewayFiles reads them, and refuses an address beyond loopback
// without tokens. Every error is the caller's to fix.
func loadGatewayFiles(routesFile, configFile, tokensFile, secretFile, addr string, logger *slog.Logger) (in gatewayFiles, err error) {
	if routesFile != "" {
		if in.routes, err = routes.LoadConfig(routesFile, os.Getenv); err != nil {
			return in, err
		}
	}
	in.models = gateway.ModelsFromRoutes(in.routes.Names())
	if configFile != "" {
		if in.models, err = gateway.LoadConfig(configFile); err != nil {
			return in, err
		}
	}
	if tokensFile != "" {
		if in.tokens, err = gateway.LoadTokens(tokensFile, logger); err != nil {
			return in, err
		}
	}
	if err := checkGatewayAddr(addr, in.tokens != nil); err != nil {
		return in, err
	}
	in.secret, in.madeSecret, err = loadGatewaySecret(secretFile)
	return in, err
}

// gatewaySetup is what serving the gateway needs, from 'gateway's flags
// or from 'dev'.
type gatewaySetup struct {
	Addr    string
	Client  *durallm.Client
	Models  gateway.Config
	Tokens  *gateway.Tokens
	Secret  []byte
	Streams *activities.Streams
	Remote  *gateway.RemoteStreams
	Logger  *slog.Logger
	Meter   metric.Meter
	// MaxBody bounds a request body (gateway.Options.MaxBody); zero means
	// the gateway's default.
	MaxBody int64
	// Spend keeps the callers' budgets; Routes describe the routes for
	// their worst cases (gateway.Options.Spend, Routes).
	Spend  callerbudget.Store
	Routes map[string]attempt.RouteInfo
}

// runningGateway is a gateway serving on its address.
type runningGateway struct {
	srv *http.Server
	g   *gateway.Gateway
	url string
}

// startGateway listens on s.Addr and serves the gateway until Close.
func startGateway(s gatewaySetup) (*runningGateway, error) {
	g, err := gateway.New(gateway.Options{Client: s.Client, Models: s.Models, Secret: s.Secret, Tokens: s.Tokens, Streams: s.Streams, Remote: s.Remote, Logger: s.Logger, Meter: s.Meter, MaxBody: s.MaxBody,
		Spend: s.Spend, Routes: s.Routes})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("gateway on %s: %w", s.Addr, err)
	}
	// No write timeout: a stream lasts as long as its answer.
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.Logger.Error("gateway stopped", "error", err)
		}
	}()
	return &runningGateway{srv: srv, g: g, url: "http://" + ln.Addr().String() + "/v1"}, nil
}

// URL is the API's base URL, as OPENAI_BASE_URL wants it.
func (r *runningGateway) URL() string { return r.url }

// Close stops accepting requests and gives those in progress a short
// bound to finish; their actions go on either way.
func (r *runningGateway) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
	r.g.Close()
}

// openSpend opens the ledger of the callers' budgets: in the journal's
// PostgreSQL with a dsn (whenever there are tokens: a reload may give a
// caller a budget), else the spend file, when a caller has a budget. Nil
// when there is nothing to keep.
func openSpend(ctx context.Context, dsn, file string, tokens *gateway.Tokens) (callerbudget.Store, error) {
	switch {
	case tokens == nil:
		return nil, nil
	case dsn != "":
		return callerbudget.OpenPostgres(ctx, dsn)
	case tokens.Budgets() && file != "":
		return callerbudget.OpenFile(file)
	}
	return nil, nil
}

// routeInfos describe the routes of cfg as the workers do, for the worst
// cases of the callers' budgets.
func routeInfos(cfg routes.Config) map[string]attempt.RouteInfo {
	m := map[string]attempt.RouteInfo{}
	for _, r := range cfg.Routes {
		m[r.Name] = attempt.RouteInfo{Name: r.Name, Kind: r.Kind, Model: r.Model, Capabilities: r.Capabilities, Prices: r.Prices, ImageTokens: r.ImageTokens}
	}
	return m
}

// devGateway starts the gateway of 'dev' on addr: the models are the demo
// group (demo: demo-primary, demo-fallback) or, with --routes, each route;
// one operator token, kept in DATA_DIR/gateway-token, and the fingerprint
// secret in DATA_DIR/gateway-secret, both made once; its counters go to
// meter, beside the worker's. It returns the gateway, its models and the
// token file.
func devGateway(addr, dataDir string, c *durallm.Client, hub *activities.Streams, routeNames []string, demo bool, logger *slog.Logger, meter metric.Meter) (*runningGateway, string, string, error) {
	models := gateway.ModelsFromRoutes(routeNames)
	if demo {
		models = gateway.Config{Models: []gateway.Model{{Name: "demo", Routes: []string{"demo-primary", "demo-fallback"}}}}
	}
	tokenFile := filepath.Join(dataDir, "gateway-token")
	token, err := os.ReadFile(tokenFile)
	if errors.Is(err, fs.ErrNotExist) {
		var r [24]byte
		_, _ = rand.Read(r[:])
		token = []byte(base64.RawURLEncoding.EncodeToString(r[:]))
		err = writeNew(tokenFile, string(token))
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("gateway token %s: %w", tokenFile, err)
	}
	secret, _, err := loadGatewaySecret(filepath.Join(dataDir, "gateway-secret"))
	if err != nil {
		return nil, "", "", err
	}
	tokens := gateway.NewTokens([]gateway.Caller{{ID: "dev", Hash: sha256.Sum256([]byte(strings.TrimSpace(string(token)))), Role: gateway.RoleOperator}})
	gw, err := startGateway(gatewaySetup{Addr: addr, Client: c, Models: models, Tokens: tokens, Secret: secret, Streams: hub, Logger: logger, Meter: meter})
	if err != nil {
		return nil, "", "", err
	}
	return gw, modelNames(models), tokenFile, nil
}
