package e2e_test

import (
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// errCutByReload is what the proxy below makes of every upstream answer.
var errCutByReload = errors.New("upstream request canceled by a config reload")

// startProxyThat502sAfterForwarding starts an HTTP/2 reverse proxy over
// TLS (the provider's certificate) in front of the provider's HTTP/1.1
// listener. It forwards each request, lets the provider execute and
// answer it, then throws the answer away and answers 502 itself with an
// empty body: what Caddy 2.6 with flush_interval -1 does to every request
// in flight when its config is reloaded.
func startProxyThat502sAfterForwarding(t *testing.T, p *providertest.Provider) string {
	t.Helper()
	target, err := url.Parse(p.HTTP1URL())
	if err != nil {
		t.Fatal(err)
	}
	upstream := &http.Transport{}
	t.Cleanup(upstream.CloseIdleConnections)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	rp.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := upstream.RoundTrip(r)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return nil, errCutByReload
	})
	certPEM, keyPEM, err := p.CertificatePEM()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(rp)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A proxy's 502 after it forwarded the request: the provider had run it.
// The 502 was upstream_error, retried by policy, so the provider ran the
// request once per attempt (up to the budget, four times). On a route
// marked intermediary that does not honour idempotency keys it is
// ambiguous (502_from_intermediary): no retry, no fallback, the action
// waits for a verdict, and the provider ran the request once.
func TestE2EAProxys502AfterForwardingIsAmbiguousAndNotRetried(t *testing.T) {
	s := newStack(t)
	base := startProxyThat502sAfterForwarding(t, s.p) + "/v1"
	s.startWorker(func(o *worker.Options) {
		caps := providers.Capabilities{Streaming: true}
		o.Config = routes.Config{Routes: []routes.Route{
			{Name: "primary", Kind: "openai", BaseURL: base, Model: "model-primary", Intermediary: true, Capabilities: caps},
			{Name: "fallback", Kind: "openai", BaseURL: base, Model: "model-fallback", Intermediary: true, Capabilities: caps},
		}}
	})
	if _, err := s.c.Start(t.Context(), "proxy-502", actionInput(true)); err != nil {
		t.Fatal(err)
	}
	st := s.waitState("proxy-502", workflows.StateAwaitingReconciliation)
	if len(st.Attempts) != 1 || st.AwaitingAttempt != 1 {
		t.Fatalf("status %+v", st)
	}
	a := st.Attempts[0]
	if a.Classification.Class != evidence.Ambiguous || a.Classification.Reason != "502_from_intermediary" ||
		a.Evidence.Status != http.StatusBadGateway || a.Evidence.HTTPVersion != "HTTP/2.0" || !a.HealthMoved {
		t.Fatalf("attempt %+v", a)
	}
	if n := s.p.ExecutedCount("proxy-502"); n != 1 {
		t.Fatalf("the provider executed the request %d times, want 1", n)
	}
	if n := len(s.p.Received()); n != 1 {
		t.Fatalf("the provider received %d requests; the ambiguous one must not be re-sent", n)
	}
}
