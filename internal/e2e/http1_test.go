package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/haproxy"
	"github.com/durallm/durallm/internal/nginx"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// HTTP/1.1 routes end to end: the workflow and the activity on the
// embedded server, with a route at a server that speaks only HTTP/1.1.

// withRoute makes the worker serve one route, "primary" (and "fallback"
// the same), at base.
func withRoute(base, version string) func(*worker.Options) {
	return func(o *worker.Options) {
		caps := providers.Capabilities{Streaming: true}
		o.Config = routes.Config{Routes: []routes.Route{
			{Name: "primary", Kind: "openai", BaseURL: base, Model: "local-model", HTTPVersion: version, Capabilities: caps},
			{Name: "fallback", Kind: "openai", BaseURL: base, Model: "local-model", HTTPVersion: version, Capabilities: caps},
		}}
	}
}

// A plain net/http server, as Ollama and most OpenAI-compatible local
// servers listen: a route with no http_version and a worker without
// --allow-h2c completes actions over HTTP/1.1, one execution each.
func TestE2EHTTP1RouteAtPlainNetHTTPServer(t *testing.T) {
	var served atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.ProtoMajor != 1 || r.URL.Path != "/v1/chat/completions" || r.Header.Get(recovery.HeaderIdempotencyKey) == "" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"local-model","choices":[{"index":0,"message":{"role":"assistant","content":"hello over HTTP/1.1"},"finish_reason":"stop"}]}`)
	}))
	defer srv.Close()
	s := newStack(t)
	s.startWorker(withRoute(srv.URL+"/v1", ""))
	for i := range 2 {
		res, err := s.run(fmt.Sprintf("h1-plain-%d", i), actionInput(false))
		if err != nil {
			t.Fatal(err)
		}
		if res.State != workflows.StateCompleted || res.Used != 1 || res.Response == nil || res.Response.Text != "hello over HTTP/1.1" {
			t.Fatalf("result %+v", res)
		}
		if v := res.Attempts[0].Evidence.HTTPVersion; v != "HTTP/1.1" {
			t.Fatalf("attempt spoke %q", v)
		}
	}
	if n := served.Load(); n != 2 {
		t.Fatalf("server executed %d requests, want 2", n)
	}
}

// nginx serving HTTP/1.1 over TLS (no http2 on its listener, so ALPN
// chooses http/1.1), proxying to the provider's HTTP/1.1 listener: the
// auto route follows ALPN and the provider executes each action once.
func TestE2EHTTP1RouteAtNginxOverTLS(t *testing.T) {
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Skip("nginx not installed (apt-get install nginx-light)")
	}
	s := newStack(t)
	addr := startNginx(t, s.p)
	s.startWorker(withRoute("https://"+addr+"/v1", ""))
	res, err := s.run("h1-nginx", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	if res.State != workflows.StateCompleted || res.Used != 1 || res.Response == nil || res.Response.Text != "ok" {
		t.Fatalf("result %+v", res)
	}
	if v := res.Attempts[0].Evidence.HTTPVersion; v != "HTTP/1.1" {
		t.Fatalf("attempt spoke %q through nginx", v)
	}
	key := ""
	for _, r := range s.p.Processed() {
		if r.Proto != providertest.ProtoHTTP11 {
			t.Fatalf("provider saw %s", r.Proto)
		}
		key = r.IdempotencyKey
	}
	if key == "" || s.p.ExecutedCount(key) != 1 {
		t.Fatalf("provider executed %v", s.p.Processed())
	}

	// A stream through nginx (chunked on both sides).
	res, err = s.run("h1-nginx-stream", actionInput(true))
	if err != nil {
		t.Fatal(err)
	}
	if res.State != workflows.StateCompleted || res.Response == nil || res.Response.Text != "ok" {
		t.Fatalf("stream result %+v", res)
	}
}

// startNginx runs nginx with an HTTP/1.1 TLS listener on a free loopback
// port that proxies to the provider's HTTP/1.1 listener, using the
// provider's certificate. It is stopped when the test ends.
func startNginx(t *testing.T, p *providertest.Provider) string {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM, err := p.CertificatePEM()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"cert.pem": certPEM, "key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := haproxy.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	upstream := strings.TrimPrefix(p.HTTP1URL(), "http://")
	n, err := nginx.Start(context.Background(), dir, addr, fmt.Sprintf(`
  upstream provider { server %[2]s; keepalive 4; }
  server {
    listen %[3]s ssl;
    ssl_certificate %[1]s/cert.pem;
    ssl_certificate_key %[1]s/key.pem;
    keepalive_timeout 75s;
    location / {
      proxy_pass http://provider;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }`, dir, upstream, addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	return addr
}

// A worker that probes its routes at start warns about a route whose
// http_version its server does not speak, naming the fix; the action on
// it then ends failed with a reason that names it too, without a
// reconciliation wait and without executing anything.
func TestE2EHTTPVersionMismatchIsNamedAtStartAndUnsent(t *testing.T) {
	s := newStack(t)
	var logs syncbuf.Buffer
	s.startWorker(withRoute(s.p.HTTP1URL()+"/v1", "2"), func(o *worker.Options) {
		o.ProbeRoutes = true
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	out := logs.String()
	// The server answers the preface and closes at once; the reset that
	// what follows the preface draws may destroy the answer, leaving a
	// silent close: either way the fix is named.
	if !strings.Contains(out, "route probe: the route's http_version does not match") || !strings.Contains(out, `http_version to \"1.1\"`) {
		t.Fatalf("no probe warning naming the fix in:\n%s", out)
	}
	in := actionInput(false)
	in.Routes = []string{"primary"}
	res, err := s.run("h1-mismatch", in)
	if err == nil {
		t.Fatal("a failed action returned no error")
	}
	if len(res.Attempts) != 1 {
		t.Fatalf("result %+v", res)
	}
	if reason := res.Attempts[0].Classification.Reason; res.State != workflows.StateFailed ||
		(reason != "server_speaks_http1.1_set_http_version" && reason != "server_does_not_speak_http2_set_http_version") {
		t.Fatalf("result %+v", res)
	}
	if n := len(s.p.Processed()); n != 0 {
		t.Fatalf("provider executed %d requests", n)
	}
}

// A stream over HTTP/1.1 from a server that keeps the body open after
// [DONE] (keep-alive comments, never ending): the action completes with the
// whole answer. The engine's HTTP/1.1 body read the rest on close, so the
// attempt lasted until its timer and ended committed_partial, and the user
// got completed_partial for a complete answer. The attempt timeout is long
// enough that a close that waited would show as that class.
func TestE2EHTTP1StreamKeptOpenAfterDoneIsCompleted(t *testing.T) {
	s := newStack(t)
	s.startWorker(withRoute(s.p.HTTP1URL()+"/v1", "1.1"))
	s.p.Push(providertest.AnswerThenKeepOpen("hello over a body that never ends"))
	in := actionInput(true)
	in.AttemptTimeout = 30 * time.Second
	res, err := s.run("h1-kept-open", in)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != workflows.StateCompleted || res.Used != 1 || res.Response == nil || res.Response.Partial ||
		res.Response.Text != "hello over a body that never ends" {
		t.Fatalf("result %+v", res)
	}
	ev := res.Attempts[0].Evidence
	if res.Attempts[0].Classification.Class != evidence.Completed || ev.HTTPVersion != "HTTP/1.1" || ev.TimedOut {
		t.Fatalf("attempt %+v", res.Attempts[0])
	}
}
