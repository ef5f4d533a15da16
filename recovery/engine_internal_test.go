package recovery

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/durallm/durallm/testsuite"
)

// Connection refs are "<engine tag>-c<n>": the tag is all that keeps two
// engines' refs apart, across processes of a fleet too. Two thousand
// engines is a small fleet's worth of workers; with a 16-bit tag a
// collision among them is all but certain (birthday bound: 1-e^(-2000²/2¹⁷)).
func TestConnRefTagsCollideAcrossProcesses(t *testing.T) {
	const n = 2000
	seen := make(map[string]int, n)
	for i := range n {
		tag := New(Config{}).proc
		if j, dup := seen[tag]; dup {
			t.Fatalf("engines %d and %d drew the same connection-ref tag %q", j, i, tag)
		}
		seen[tag] = i
	}
}

// newTestEngine returns an engine and a provider on loopback h2c.
func newTestEngine(t *testing.T, cfg Config) (*Engine, *testsuite.Provider) {
	t.Helper()
	p, err := testsuite.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	cfg.AllowH2C = true
	cfg.Logger = slog.New(slog.DiscardHandler)
	e := New(cfg)
	t.Cleanup(func() {
		e.Close()
		p.Close()
	})
	return e, p
}

// conns returns every pooled connection of e.
func (e *Engine) conns() []*pooledConn {
	e.pool.mu.Lock()
	defer e.pool.mu.Unlock()
	var out []*pooledConn
	for _, ap := range e.pool.byAuth {
		out = append(out, ap.conns...)
	}
	return out
}

// A connection that is never rotated must not remember every stream it
// ever carried: an attempt's entry goes when the attempt settles.
func TestObserverStreamMapNeverPruned(t *testing.T) {
	e, p := newTestEngine(t, Config{})
	const n = 500
	for i := range n {
		a := NewAttempt(Spec{IdempotencyKey: "prune"})
		req, err := http.NewRequestWithContext(WithAttempt(t.Context(), a), http.MethodPost, p.H2CURL()+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := e.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if _, c := a.Finish(SignalNone); c.Class != Completed {
			t.Fatalf("request %d: %s (%s)", i, c.Class, c.Reason)
		}
	}
	cs := e.conns()
	if len(cs) != 1 {
		t.Fatalf("%d connections; the test needs all %d requests on one", len(cs), n)
	}
	oc := cs[0].oc
	oc.mu.Lock()
	left := len(oc.streams)
	oc.mu.Unlock()
	if left != 0 {
		t.Fatalf("after %d settled attempts the connection still maps %d streams", n, left)
	}
	e.obs.mu.Lock()
	tracked := len(e.obs.attempts)
	e.obs.mu.Unlock()
	if got := tracked; got != 0 {
		t.Fatalf("observer still tracks %d attempts", got)
	}
}
