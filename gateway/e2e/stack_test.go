package e2e_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/temporaltest"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/gateway"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/callerbudget"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// The callers every stack knows, and their tokens.
const (
	tokenA   = "tok-caller-a"
	tokenB   = "tok-caller-b"
	tokenOps = "tok-operator"
	// tokenOne's caller may have one request in progress at a time.
	tokenOne = "tok-one-at-a-time"
	// tokenCapped's caller "capped" has a budget (stackOptions.cappedTokens).
	tokenCapped = "tok-capped"
)

func sum(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

// gwStack is the gateway on the embedded Temporal server, with a worker in
// its process (sharing the Temporal client and the stream hub, eager
// start on) whose routes point at the providertest provider.
type gwStack struct {
	t    *testing.T
	ts   *temporaltest.TestServer
	tc   client.Client
	p    *providertest.Provider
	c    *durallm.Client
	hub  *activities.Streams
	g    *gateway.Gateway
	srv  *httptest.Server
	logs *syncbuf.Buffer
	tk   *gateway.Tokens
	w    *worker.Worker
	// requests counts what reached the gateway's handler.
	requests atomic.Int64
	tq       string
	models   gateway.Config
	// surfaces are the gateways' surfaces beside chat and Messages.
	surfaces []answer.Surface
}

type stackOptions struct {
	models       gateway.Config
	streamHold   time.Duration
	tokensFile   string
	apiKeyEnv    string
	workerLogger *slog.Logger
	// remote puts the worker apart from the gateway: its own Temporal
	// client, no shared hub, its stream endpoint on loopback; the gateway
	// reads streams through it (gateway.RemoteStreams).
	remote bool
	// workerStreams has the in-process worker serve its streams on
	// loopback too (durallm gateway --stream-addr), for other gateways.
	workerStreams bool
	// claude adds the route "claude" of kind anthropic on the same
	// provider (which answers what a test gives it to), and the model
	// "claude" on it.
	claude bool
	// writeTimeout is the gateway's Options.WriteTimeout; zero the
	// default.
	writeTimeout time.Duration
	// smallBuffers gives the gateway's connections small send buffers,
	// so that a caller that stops reading blocks its writes soon.
	smallBuffers bool
	// spend is the gateway's ledger of the callers' budgets, and
	// cappedTokens the budget, in tokens per day, of the caller
	// "capped" (tokenCapped), which the tokens then have.
	spend        callerbudget.Store
	cappedTokens int64
	// surfaces are served beside chat and Messages, by every gateway of
	// the stack.
	surfaces []answer.Surface
}

// smallBuffers is a listener whose connections have 4 KiB send buffers.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

func newGateway(t *testing.T, opts ...func(*stackOptions)) *gwStack {
	t.Helper()
	so := stackOptions{models: gateway.Config{Models: []gateway.Model{
		{Name: "demo", Routes: []string{"primary", "fallback"}, DisconnectGrace: 10 * time.Second},
		{Name: "primary", Routes: []string{"primary"}},
	}}}
	for _, f := range opts {
		f(&so)
	}
	logs := &syncbuf.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ts := temporaltest.NewServer(temporaltest.WithT(t), temporaltest.WithBaseServerOptions(devserver.TemporaltestOption()))
	// The Temporal SDK's own logger goes to the same buffer at Debug: it
	// must never log content either.
	tc := ts.NewClientWithOptions(client.Options{Logger: sdklog.NewStructuredLogger(logger)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := tc.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: ts.GetDefaultNamespace(), SearchAttributes: workflows.SearchAttributes,
	}); err != nil {
		t.Fatal(err)
	}
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	s := &gwStack{t: t, ts: ts, tc: tc, p: p, logs: logs, tq: "gw-" + strings.ReplaceAll(t.Name(), "/", "-"), hub: activities.NewStreams()}
	caps := providers.Capabilities{Tools: true, Streaming: true, StructuredOutput: true}
	cfg := routes.Config{Routes: []routes.Route{
		{Name: "primary", Kind: "openai", BaseURL: p.URL() + "/v1", Model: "model-primary", Capabilities: caps, APIKeyEnv: so.apiKeyEnv},
		{Name: "fallback", Kind: "openai", BaseURL: p.URL() + "/v1", Model: "model-fallback", Capabilities: caps, APIKeyEnv: so.apiKeyEnv},
	}}
	if so.claude {
		cfg.Routes = append(cfg.Routes, routes.Route{Name: "claude", Kind: routes.KindAnthropic, BaseURL: p.URL() + "/v1", Model: "claude-test",
			Capabilities: providers.Capabilities{Tools: true, Streaming: true}})
		so.models.Models = append(so.models.Models, gateway.Model{Name: "claude", Routes: []string{"claude"}})
	}
	wl := so.workerLogger
	if wl == nil {
		wl = logger
	}
	wo := worker.Options{TaskQueue: s.tq, Config: cfg, TLS: p.ClientTLSConfig(), SearchAttributes: true, Logger: wl, Streams: s.hub}
	wtc := tc
	if so.workerStreams {
		wo.StreamAddr = "127.0.0.1:0"
	}
	if so.remote {
		wtc = ts.NewClientWithOptions(client.Options{Logger: sdklog.NewStructuredLogger(logger)})
		wo.Streams, wo.StreamAddr, s.hub = nil, "127.0.0.1:0", nil
	}
	w, err := worker.New(wtc, wo)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	s.w = w
	s.c = durallm.NewClient(tc, s.tq).WithNamespace(ts.GetDefaultNamespace())
	if !so.remote {
		s.c.WithEagerStart()
	}
	var tokens *gateway.Tokens
	if so.tokensFile != "" {
		tokens, err = gateway.LoadTokens(so.tokensFile, logger)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		yaml := fmt.Sprintf("tokens:\n  - id: a\n    sha256: %s\n  - id: b\n    sha256: %s\n  - id: ops\n    sha256: %s\n    role: operator\n  - id: one\n    sha256: %s\n    max_in_flight: 1\n",
			sum(tokenA), sum(tokenB), sum(tokenOps), sum(tokenOne))
		if so.cappedTokens > 0 {
			yaml += fmt.Sprintf("  - id: capped\n    sha256: %s\n    budget: {tokens: %d, period: day}\n", sum(tokenCapped), so.cappedTokens)
		}
		cs, err := gateway.ParseTokens([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		tokens = gateway.NewTokens(cs)
	}
	s.tk = tokens
	s.models = so.models
	s.surfaces = so.surfaces
	gopts := gateway.Options{Client: s.c, Models: so.models, Secret: []byte(strings.Repeat("k", 32)), Tokens: tokens,
		Streams: s.hub, Logger: logger, StreamHold: so.streamHold, StatePoll: 50 * time.Millisecond, WriteTimeout: so.writeTimeout, Spend: so.spend,
		Surfaces: so.surfaces}
	if so.remote {
		gopts.Remote = &gateway.RemoteStreams{}
	}
	s.g, err = gateway.New(gopts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.g.Close)
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		s.g.ServeHTTP(w, r)
	}))
	if so.smallBuffers {
		s.srv.Listener = smallBuffers{s.srv.Listener}
	}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *gwStack) tokens() *gateway.Tokens { return s.tk }

// besideOptions say how another gateway of the same task queue is set up.
type besideOptions struct {
	// hub gives it a hub of its own, as a gateway with a worker has, but
	// empty: a restarted gateway, or another replica.
	hub bool
	// remote has it read the streams of workers elsewhere.
	remote *gateway.RemoteStreams
	// tc is its own Temporal client; nil shares the stack's.
	tc client.Client
	// startTimeout is its Options.StartTimeout; zero the default.
	startTimeout time.Duration
	// requests, when set, counts the requests that reach it.
	requests *atomic.Int64
	// left, when set, is closed once the first request's context ends
	// (its caller left, or it was answered).
	left chan struct{}
	// spend is its ledger of the callers' budgets; spendSweep its
	// Options.SpendSweep.
	spend      callerbudget.Store
	spendSweep time.Duration
}

// beside starts another gateway over the same Temporal server, task
// queue, tokens and secret, without the first one's hub: a gateway with
// --worker=false, or one restarted since the action started. It returns
// the gateway's base URL (the API's root, without /v1).
func (s *gwStack) beside(o besideOptions) string {
	url, _ := s.besideStoppable(o)
	return url
}

// besideStoppable is beside, and a stop that closes the gateway (its
// server, then the gateway) before the test ends: a gateway that stops.
func (s *gwStack) besideStoppable(o besideOptions) (string, func()) {
	s.t.Helper()
	tc := s.tc
	if o.tc != nil {
		tc = o.tc
	}
	gopts := gateway.Options{Client: durallm.NewClient(tc, s.tq).WithNamespace(s.ts.GetDefaultNamespace()), Models: s.models, Secret: []byte(strings.Repeat("k", 32)), Tokens: s.tk,
		Logger: slog.New(slog.NewJSONHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})), StatePoll: 50 * time.Millisecond, Remote: o.remote,
		StartTimeout: o.startTimeout, Spend: o.spend, SpendSweep: o.spendSweep, Surfaces: s.surfaces}
	if o.hub {
		gopts.Streams = activities.NewStreams()
	}
	g, err := gateway.New(gopts)
	if err != nil {
		s.t.Fatal(err)
	}
	var leftOnce sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.requests != nil {
			o.requests.Add(1)
		}
		if o.left != nil {
			// Once: a client that resends sends the gateway a second
			// request, whose end must not close the channel again.
			go func() { <-r.Context().Done(); leftOnce.Do(func() { close(o.left) }) }()
		}
		g.ServeHTTP(w, r)
	}))
	var once sync.Once
	stop := func() { once.Do(func() { srv.Close(); g.Close() }) }
	s.t.Cleanup(stop)
	return srv.URL, stop
}

// client is openai-go pointed at the gateway (or at base), with the
// SDK's default retries unless opts say otherwise.
func (s *gwStack) client(token string, opts ...option.RequestOption) *openai.Client {
	return s.clientAt(s.srv.URL+"/v1", token, opts...)
}

func (s *gwStack) clientAt(base, token string, opts ...option.RequestOption) *openai.Client {
	all := append([]option.RequestOption{option.WithBaseURL(base), option.WithAPIKey(token), option.WithHTTPClient(&http.Client{})}, opts...)
	c := openai.NewClient(all...)
	return &c
}

func chatParams(model, prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// executed is how many requests the provider executed.
func (s *gwStack) executed() int { return len(s.p.Processed()) }

// result waits for an action's terminal result.
func (s *gwStack) result(id string) workflows.ActionResult {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.c.Get(id).Result(ctx)
	var ae *durallm.ActionError
	if err != nil && !errors.As(err, &ae) {
		s.t.Fatalf("result of %s: %v", id, err)
	}
	if ae != nil {
		res = ae.Result
	}
	return res
}

func (s *gwStack) waitState(id string, want workflows.State) workflows.Status {
	s.t.Helper()
	var st workflows.Status
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var err error
		if st, err = s.c.Status(context.Background(), id); err == nil && st.State == want {
			return st
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("action %s never reached %s (last %s)", id, want, st.State)
	return st
}

// do sends a raw request to the gateway.
func (s *gwStack) do(ctx context.Context, method, path, token, body string, header map[string]string) (*http.Response, []byte) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, s.srv.URL+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp, b
}

func errType(t *testing.T, body []byte) (typ, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Type string  `json:"type"`
			Code *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("not an error body: %s", body)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return e.Error.Type, code
}

// cutProxy forwards connections to the gateway; the first one it cuts
// (both ways) once cut() says so, without an answer: a connection error
// to the client after the request was forwarded.
type cutProxy struct {
	ln    net.Listener
	cut   func() bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

// track keeps c to close at the end, so idle keep-alive connections do
// not outlive the test.
func (p *cutProxy) track(c ...net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c...)
	p.mu.Unlock()
}

func newCutProxy(t *testing.T, target string, cut func() bool) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, cut: cut}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	go func() {
		first := true
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", strings.TrimPrefix(target, "http://"))
			if err != nil {
				c.Close()
				continue
			}
			p.track(c, up)
			p.wg.Add(2)
			cutThis := first
			first = false
			go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() {
				defer p.wg.Done()
				if cutThis {
					deadline := time.Now().Add(20 * time.Second)
					for !p.cut() && time.Now().Before(deadline) {
						time.Sleep(5 * time.Millisecond)
					}
					c.Close()
					up.Close()
					return
				}
				_, _ = io.Copy(c, up)
				c.Close()
			}()
		}
	}()
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() + "/v1" }
