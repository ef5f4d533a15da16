package recovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/testsuite/providertest"
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
func newTestEngine(t *testing.T, cfg Config) (*Engine, *providertest.Provider) {
	t.Helper()
	p, err := providertest.NewProvider()
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
		if _, c := a.Finish(evidence.SignalNone); c.Class != evidence.Completed {
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

// gateConn holds the first write after arm until release: a socket whose
// peer stopped reading, on demand.
type gateConn struct {
	net.Conn
	mu         sync.Mutex
	armed      bool
	held, gate chan struct{}
}

// arm makes the next write wait; held is closed once one does.
func (c *gateConn) arm() (held <-chan struct{}, release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.held, c.gate = true, make(chan struct{}), make(chan struct{})
	gate := c.gate
	var once sync.Once
	return c.held, func() { once.Do(func() { close(gate) }) }
}

func (c *gateConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	armed, held, gate := c.armed, c.held, c.gate
	c.armed = false
	c.mu.Unlock()
	if armed {
		close(held)
		<-gate
	}
	return c.Conn.Write(b)
}

// post sends one request with ctx and returns the attempt's result.
func post(t *testing.T, e *Engine, ctx context.Context, url string, header http.Header) (evidence.Evidence, evidence.Classification, error) {
	t.Helper()
	a := NewAttempt(Spec{IdempotencyKey: t.Name()})
	req, err := http.NewRequestWithContext(WithAttempt(ctx, a), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := e.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	ev, c := a.Finish(evidence.SignalNone)
	return ev, c, err
}

// The context ends while the attempt's header block is stuck in a write:
// the write barrier cannot pass within its bound, so nothing proves the
// request stayed, and it did not: the server gets it once the write goes
// through. The attempt must read maybe-sent and ambiguous, never unsent.
func TestContextEndingWhileWritingHeadersMaybeSent(t *testing.T) {
	var gc *gateConn
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		gc = &gateConn{Conn: c}
		return gc, nil
	}
	// DialTimeout also bounds the barrier's wait.
	e, p := newTestEngine(t, Config{DialContext: dial, DialTimeout: 300 * time.Millisecond})
	if _, c, err := post(t, e, t.Context(), p.H2CURL(), nil); c.Class != evidence.Completed {
		t.Fatalf("warm-up: %s (%s) %v", c.Class, c.Reason, err)
	}
	p.SetDefault(providertest.Hold())

	held, release := gc.arm()
	defer release()
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	go func() {
		<-held // the header block is being written
		cancel(fmt.Errorf("attempt timer: %w", ErrTimedOut))
	}()
	big := http.Header{"X-Padding": {strings.Repeat("0123456789abcdef", 4<<10)}}
	ev, c, err := post(t, e, ctx, p.H2CURL(), big)
	if err == nil {
		t.Fatal("the request succeeded; it should have ended with its context")
	}
	if ev.RequestSent || !ev.MaybeSent || !ev.TimedOut || c.Class != evidence.Ambiguous || c.Reason != "context_ended_while_sending" {
		t.Fatalf("classified %s (%s), evidence %+v", c.Class, c.Reason, ev)
	}
	if n := e.Stats().MaybeSent; n != 1 {
		t.Fatalf("Stats().MaybeSent = %d, want 1", n)
	}

	// Let the write through: the request does reach the server, which is
	// why "unsent" would have been a lie.
	release()
	p.SetDefault(providertest.Answer("ok"))
	if _, c, err := post(t, e, t.Context(), p.H2CURL(), nil); c.Class != evidence.Completed {
		t.Fatalf("fence: %s (%s) %v", c.Class, c.Reason, err)
	}
	found := false
	for _, r := range p.Received() {
		found = found || r.AttemptID == ev.AttemptID
	}
	if !found {
		t.Fatal("the held header block never reached the server; the scenario did not happen")
	}
	// Its late END_HEADERS found the attempt untracked and left no entry.
	oc := e.conns()[0].oc
	oc.mu.Lock()
	left := len(oc.streams)
	oc.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d stream entries left", left)
	}
}

// After a GOAWAY, x/net refuses a new stream without writing a byte, and
// its RoundTrip returns only once its writer is done; the context is still
// live. That alone proves the request never left (the case that lets the
// engine re-pick a connection), so no barrier PING is spent on it.
func TestNeverLeftAfterGoAwayNeedsNoBarrier(t *testing.T) {
	e, p := newTestEngine(t, Config{})
	if _, c, err := post(t, e, t.Context(), p.H2CURL(), nil); c.Class != evidence.Completed {
		t.Fatalf("warm-up: %s (%s) %v", c.Class, c.Reason, err)
	}
	pc := e.conns()[0]
	p.Drain(http2.ErrCodeNo)
	deadline := time.Now().Add(10 * time.Second) // a bound, not an assertion
	for !pc.cc.State().Closing {
		if time.Now().After(deadline) {
			t.Fatal("x/net never processed the GOAWAY")
		}
		time.Sleep(time.Millisecond)
	}

	const id = "never-left"
	e.obs.Track(id)
	defer e.obs.Untrack(id)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, p.H2CURL()+"/v1/chat/completions", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(HeaderAttemptID, id)
	pings, _ := pc.oc.writeMark()
	if _, err := pc.cc.RoundTrip(req); err == nil {
		t.Fatal("x/net sent a request on a connection that got GOAWAY")
	}
	never, maybe := e.neverLeft(t.Context(), req, id, pc)
	if !never || maybe {
		t.Fatalf("neverLeft = %v, %v; want proven never left", never, maybe)
	}
	if now, _ := pc.oc.writeMark(); now != pings {
		t.Fatalf("%d PINGs written; a live context needs no barrier", now-pings)
	}
	for _, r := range p.Received() {
		if r.AttemptID == id {
			t.Fatal("the server received the request after all")
		}
	}
}

// A connection stuck in a write blocked every pick: the pool asked x/net
// for the connection's state under its one lock, and x/net's State takes
// the connection's write lock, which a writer blocked on a peer that
// stopped reading holds indefinitely. One stuck connection then stalled
// new attempts to every authority. A pick must never wait on a
// connection's writer.
func TestAConnectionStuckInAWriteBlocksNoOtherPick(t *testing.T) {
	stuck, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	stuckAddr := strings.TrimPrefix(stuck.H2CURL(), "http://")
	var gc *gateConn
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil || addr != stuckAddr {
			return c, err
		}
		gc = &gateConn{Conn: c}
		return gc, nil
	}
	e, other := newTestEngine(t, Config{DialContext: dial})
	if _, c, err := post(t, e, t.Context(), stuck.H2CURL(), nil); c.Class != evidence.Completed {
		t.Fatalf("warm-up: %s (%s) %v", c.Class, c.Reason, err)
	}
	held, release := gc.arm()
	defer release()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _, _, _ = post(t, e, ctx, stuck.H2CURL(), nil) }() // its HEADERS write is held
	<-held
	// A second attempt to the stuck authority picks its connection; before
	// the fix it waited for the writer inside the pool's lock.
	go func() { _, _, _ = post(t, e, ctx, stuck.H2CURL(), nil) }()
	time.Sleep(50 * time.Millisecond) // let it reach the pool (ordering only)

	done := make(chan evidence.Classification, 1)
	go func() {
		_, c, _ := post(t, e, t.Context(), other.H2CURL(), nil)
		done <- c
	}()
	select {
	case c := <-done:
		if c.Class != evidence.Completed {
			t.Fatalf("another authority's attempt: %s (%s)", c.Class, c.Reason)
		}
	case <-time.After(10 * time.Second): // a bound on a hang, not a timing
		release()
		t.Fatal("an attempt to another authority waited on a connection stuck in a write")
	}
}

// sendHeader must give exactly what Clone followed by Set gave (the
// engine's former code), leave the caller's header alone, and keep every
// value slice at its own capacity, so an append to one cannot overwrite
// another's value in the shared array.
func TestSendHeaderIsCloneAndSet(t *testing.T) {
	reference := func(h http.Header, id, key string) http.Header {
		out := h.Clone()
		if out == nil {
			out = make(http.Header)
		}
		out.Set(HeaderAttemptID, id)
		if key != "" && out.Get(HeaderIdempotencyKey) == "" {
			out.Set(HeaderIdempotencyKey, key)
		}
		return out
	}
	cases := []struct {
		name string
		h    http.Header
		key  string
	}{
		{"nil header", nil, ""},
		{"nil header, key", nil, "k1"},
		{"empty", http.Header{}, "k1"},
		{"values", http.Header{"Content-Type": {"application/json"}, "Accept": {"a", "b"}}, "k1"},
		{"nil and empty values kept", http.Header{"X-Nil": nil, "X-Empty": {}}, "k1"},
		{"caller's own key wins", http.Header{HeaderIdempotencyKey: {"mine"}}, "k1"},
		{"caller's empty key replaced", http.Header{HeaderIdempotencyKey: {""}}, "k1"},
		{"caller's attempt id replaced", http.Header{HeaderAttemptID: {"forged", "two"}}, "k1"},
		{"no key", http.Header{"Authorization": {"Bearer x"}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := fmt.Sprint(c.h)
			got := sendHeader(c.h, "att-1", c.key)
			want := reference(c.h, "att-1", c.key)
			if fmt.Sprint(got) != fmt.Sprint(want) || len(got) != len(want) {
				t.Fatalf("sendHeader = %v, want %v", got, want)
			}
			for k, vv := range want {
				if (vv == nil) != (got[k] == nil) {
					t.Fatalf("%s: nil-ness differs: got %#v, want %#v", k, got[k], vv)
				}
			}
			if fmt.Sprint(c.h) != before {
				t.Fatalf("caller's header changed: %v, was %v", c.h, before)
			}
			for k, vv := range got {
				if cap(vv) != len(vv) {
					t.Fatalf("%s: cap %d > len %d: an append would write into another header's values", k, cap(vv), len(vv))
				}
			}
		})
	}
}
