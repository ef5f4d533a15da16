package recovery_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
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

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// These tests drive the engine's HTTP/1.1 client against the provider's
// HTTP/1.1 listeners (and plain net/http servers) on loopback, and check,
// for each HTTP/1.1 row of docs/recovery.md, the class and what the
// provider executed.

// v11 makes a context that sends as HTTP/1.1.
func v11(ctx context.Context) context.Context {
	return recovery.WithHTTPVersion(ctx, recovery.HTTPVersion11)
}

func (h *harness) wantVersion(r result, v string) {
	h.t.Helper()
	if r.ev.HTTPVersion != v {
		h.t.Fatalf("http_version %q, want %q; evidence %+v", r.ev.HTTPVersion, v, r.ev)
	}
}

func (h *harness) wantReason(r result, reason string) {
	h.t.Helper()
	if r.c.Reason != reason {
		h.t.Fatalf("reason %q, want %q; evidence %+v; err %v", r.c.Reason, reason, r.ev, r.err)
	}
}

// A plain net/http HTTP/1.1 server, as Ollama and most OpenAI-compatible
// local servers are: auto over http:// without --allow-h2c speaks
// HTTP/1.1, completes, and keeps the connection alive for the next
// attempt.
func TestHTTP1RouteAtPlainNetHTTPServerCompletesAndReusesConnection(t *testing.T) {
	var served atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		if r.ProtoMajor != 1 {
			t.Errorf("server saw %s", r.Proto)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
	}))
	defer srv.Close()
	e := recovery.New(recovery.Config{Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	h := &harness{t: t, e: e}

	first := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k1"}, srv.URL, false, nil)
	h.want(first, evidence.Completed)
	h.wantVersion(first, "HTTP/1.1")
	if !first.ev.ConnFresh || first.ev.RequestBytes == 0 || first.body == "" {
		t.Fatalf("first attempt: evidence %+v body %q", first.ev, first.body)
	}
	second := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k2"}, srv.URL, false, nil)
	h.want(second, evidence.Completed)
	if second.ev.ConnFresh || second.ev.ConnRef != first.ev.ConnRef {
		t.Fatalf("second attempt did not reuse the kept-alive connection: %+v", second.ev)
	}
	if st := e.Stats(); st.HTTP1Reused != 1 || st.HTTP1ConnsOpened != 1 {
		t.Fatalf("stats %+v", st)
	}
	if served.Load() != 2 {
		t.Fatalf("server served %d requests, want 2", served.Load())
	}
}

// auto over TLS follows ALPN: the HTTP/2 listener gets HTTP/2, the
// listener that offers only http/1.1 gets HTTP/1.1, and the engine
// remembers it for the authority.
func TestAutoOverTLSFollowsALPN(t *testing.T) {
	h := newHarness(t)
	r2 := h.send(t.Context(), recovery.Spec{}, h.p.URL(), false, nil)
	h.want(r2, evidence.Completed)
	h.wantVersion(r2, "HTTP/2.0")
	for i := range 2 {
		r1 := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k-alpn"}, h.p.HTTP1TLSURL(), false, nil)
		h.want(r1, evidence.Completed)
		h.wantVersion(r1, "HTTP/1.1")
		if fresh := i == 0; r1.ev.ConnFresh != fresh {
			t.Fatalf("attempt %d: conn_fresh %v", i+1, r1.ev.ConnFresh)
		}
	}
	h.executed("k-alpn", 2)
	for _, rec := range h.p.Processed() {
		if rec.IdempotencyKey == "k-alpn" && rec.Proto != providertest.ProtoHTTP11 {
			t.Fatalf("provider saw %s", rec.Proto)
		}
	}
}

// Fault: close after reading the request. Written, no answer: HTTP/1.1
// cannot prove it unprocessed, and the provider did execute it.
func TestHTTP1CloseAfterReadingTheRequestIsAmbiguous(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.CloseAfterRead())
	r := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-close"}, h.p.HTTP1URL(), false, nil)
	h.want(r, evidence.Ambiguous)
	h.wantReason(r, "http1_connection_closed_after_request")
	if !r.ev.RequestSent || !r.ev.ConnClosed || r.ev.ResponseHeaders {
		t.Fatalf("evidence %+v", r.ev)
	}
	h.executed("k-close", 1)
}

// The hidden replay: net/http's transport re-sends a request carrying
// Idempotency-Key when a reused connection fails before any answer. The
// engine must send it exactly once; the provider counts what arrived.
func TestHTTP1NoHiddenReplayOnReusedConnection(t *testing.T) {
	h := newHarness(t)
	h.want(h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "warm"}, h.p.HTTP1URL(), false, nil), evidence.Completed)
	h.p.Push(providertest.CloseAfterRead())
	r := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-replay"}, h.p.HTTP1URL(), false, nil)
	h.want(r, evidence.Ambiguous)
	h.wantReason(r, "http1_reused_connection_closed_after_request")
	if n := receivedFor(h.p, r.ev.AttemptID); n != 1 {
		t.Fatalf("provider received the attempt %d times: a hidden replay", n)
	}
	h.executed("k-replay", 1)
	if st := h.e.Stats(); st.HTTP1RaceLost != 1 || st.TransportReplays != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The same scenario through net/http's own transport: it does re-send
// (the provider receives the request twice), which is why the engine
// does not use it and why the test above can fail.
func TestNetHTTPTransportReplaysIdempotencyKeyRequestOnReusedConnection(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	post := func(key string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.HTTP1URL()+"/v1/chat/completions", bytes.NewReader([]byte(`{"model":"m"}`)))
		req.Header.Set(recovery.HeaderIdempotencyKey, key)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	post("warm")
	p.Push(providertest.CloseAfterRead())
	post("k-nethttp")
	if n := p.ExecutedCount("k-nethttp"); n != 2 {
		t.Fatalf("net/http executed the request %d times; this test documents that it replays (2)", n)
	}
}

// The keep-alive race, the side the engine wins: the server closed an
// idle connection before the next request. The usability check finds
// it closed; it is discarded unwritten and a new connection carries the
// request, which executes once.
func TestHTTP1IdleConnectionClosedByServerIsDiscardedUnwritten(t *testing.T) {
	h := newHarness(t)
	warm := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "warm"}, h.p.HTTP1URL(), false, nil)
	h.want(warm, evidence.Completed)
	waitFor(t, func() bool { return h.p.CloseIdleConns() == 1 })
	waitFor(t, func() bool { return h.p.HTTP1ConnsOpen() == 0 })
	r := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-idle"}, h.p.HTTP1URL(), false, nil)
	h.want(r, evidence.Completed)
	if !r.ev.ConnFresh || r.ev.ConnRef == warm.ev.ConnRef {
		t.Fatalf("the request used the closed connection: %+v", r.ev)
	}
	if st := h.e.Stats(); st.HTTP1ClosedIdle != 1 || st.HTTP1Reused != 0 || st.HTTP1RaceLost != 0 {
		t.Fatalf("stats %+v", st)
	}
	h.executed("k-idle", 1)
}

// The keep-alive race, the side the engine loses: the server closes the
// reused connection as the request reaches it, without processing it.
// Nothing on the wire can tell that from a request processed and then
// lost: ambiguous, counted, and never re-sent.
func TestHTTP1KeepAliveRaceLostIsAmbiguous(t *testing.T) {
	h := newHarness(t)
	h.want(h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "warm"}, h.p.HTTP1URL(), false, nil), evidence.Completed)
	h.p.Push(providertest.CloseAfterRead().Processed(false))
	r := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-race"}, h.p.HTTP1URL(), false, nil)
	h.want(r, evidence.Ambiguous)
	h.wantReason(r, "http1_reused_connection_closed_after_request")
	if st := h.e.Stats(); st.HTTP1RaceLost != 1 {
		t.Fatalf("stats %+v", st)
	}
	h.executed("k-race", 0)
	if n := receivedFor(h.p, r.ev.AttemptID); n != 1 {
		t.Fatalf("received %d times", n)
	}
}

// Fault: Connection: close after a complete response is completed, and
// the next attempt dials a new connection.
func TestHTTP1ConnectionCloseAfterCompleteResponseIsCompleted(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.AnswerThenClose("bye"))
	r := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-cc"}, h.p.HTTP1URL(), false, openAISignal)
	h.want(r, evidence.Completed)
	next := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-next"}, h.p.HTTP1URL(), false, openAISignal)
	h.want(next, evidence.Completed)
	if !next.ev.ConnFresh {
		t.Fatalf("a connection the server said it would close was reused: %+v", next.ev)
	}
	h.executed("k-cc", 1)
	h.executed("k-next", 1)
}

// Fault: a chunked body cut mid-chunk, after content (committed_partial)
// and before it (ambiguous), as for HTTP/2.
func TestHTTP1ChunkedBodyCutMidChunk(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.StreamCut(2, providertest.CutClose))
	r := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-cut"}, h.p.HTTP1URL(), true, nil)
	h.want(r, evidence.CommittedPartial)
	if !r.ev.BodyFailed || !strings.Contains(r.body, "chunk2") {
		t.Fatalf("evidence %+v body %q", r.ev, r.body)
	}
	h.executed("k-cut", 1)

	h.p.Push(providertest.BodyCut(200, nil, `{"choices":[{"mess`, providertest.CutClose))
	r = h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-cut-early", ManualCommit: true}, h.p.HTTP1URL(), false, nil)
	h.want(r, evidence.Ambiguous)
	h.wantReason(r, "body_failed_before_content")
	h.executed("k-cut-early", 1)
}

// Fault: a slow first byte. A timer that ends the wait after the request
// was written is ambiguous (the provider is generating); the provider
// executed it once.
func TestHTTP1SlowFirstByteTimesOutAmbiguous(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Answer("late").After(time.Hour))
	ctx, cancel := context.WithTimeoutCause(v11(t.Context()), 200*time.Millisecond, recovery.ErrTimedOut)
	defer cancel()
	r := h.send(ctx, recovery.Spec{IdempotencyKey: "k-slow"}, h.p.HTTP1URL(), true, nil)
	h.want(r, evidence.Ambiguous)
	h.wantReason(r, "timeout_after_send")
	h.executed("k-slow", 1)
}

// A slow first byte within the wait completes.
func TestHTTP1SlowFirstByteWithinTheWaitCompletes(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	h.p.Push(providertest.Answer("late but fine").WaitFor(release))
	done := make(chan result, 1)
	go func() {
		done <- h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-slow-ok"}, h.p.HTTP1URL(), true, nil)
	}()
	waitFor(t, func() bool { return h.p.ExecutedCount("k-slow-ok") == 1 })
	close(release)
	r := <-done
	h.want(r, evidence.Completed)
	if !strings.Contains(r.body, "fine") {
		t.Fatalf("body %q", r.body)
	}
}

// A timer before anything was written is unsent: the count of bytes
// written is exact.
func TestHTTP1TimerBeforeAnyByteIsUnsent(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancelCause(v11(t.Context()))
	cancel(recovery.ErrTimedOut)
	r := h.send(ctx, recovery.Spec{IdempotencyKey: "k-never"}, h.p.HTTP1URL(), false, nil)
	h.want(r, evidence.Unsent)
	h.executed("k-never", 0)
}

// HTTP1IdleTimeout keeps idle connections below the server's keep-alive:
// negative disables reuse; an idle time past it closes the connection
// (counted) instead of writing to it.
func TestHTTP1IdleTimeoutClosesIdleConnectionsBeforeTheServer(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, tc := range []struct {
		name    string
		idle    time.Duration
		expired int64
	}{{"no keep-alive", -1, 0}, {"expired", time.Nanosecond, 2}} { // both connections expire
		t.Run(tc.name, func(t *testing.T) {
			e := recovery.New(recovery.Config{HTTP1IdleTimeout: tc.idle, Logger: slog.New(slog.DiscardHandler)})
			defer e.Close()
			h := &harness{t: t, p: p, e: e}
			a := h.send(t.Context(), recovery.Spec{}, p.HTTP1URL(), false, nil)
			b := h.send(t.Context(), recovery.Spec{}, p.HTTP1URL(), false, nil)
			h.want(a, evidence.Completed)
			h.want(b, evidence.Completed)
			if !b.ev.ConnFresh {
				t.Fatalf("idle connection reused: %+v", b.ev)
			}
			waitFor(t, func() bool { return e.Stats().HTTP1Expired == tc.expired })
		})
	}
}

// Protocol mismatch: cleartext HTTP/2 (auto with AllowH2C) at an
// HTTP/1.1 server is unsent, with a reason that names the fix, whether
// the server answers the preface with 400 (providertest) or 200 (Go's
// net/http hands "PRI *" to the handler); nothing was executed, and the
// engine then speaks HTTP/1.1 to that authority (an auto request).
func TestH2CAtHTTP1ServerIsUnsentNamingTheFix(t *testing.T) {
	var served atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "PRI" {
			served.Add(1)
		}
	}))
	defer srv.Close()
	h := newHarness(t)
	for _, tc := range []struct {
		name, url string
		executed  func() int
	}{
		{"providertest", h.p.HTTP1URL(), func() int { return h.p.ExecutedCount("k-mismatch-providertest") }},
		{"net/http", srv.URL, func() int { return int(served.Load()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k-mismatch-" + tc.name}, tc.url, false, nil)
			h.want(r, evidence.Unsent)
			// Both servers answer and close at once, so the reset that
			// the HEADERS after the preface draw may destroy the answer
			// before it is read: then the server was silent, which over
			// h2c is a mismatch too.
			switch {
			case r.ev.ProtocolMismatch == evidence.MismatchHTTP11 && errors.Is(r.err, recovery.ErrSpeaksHTTP1):
				h.wantReason(r, "server_speaks_http1.1_set_http_version")
			case r.ev.ProtocolMismatch == evidence.MismatchNotHTTP2 && errors.Is(r.err, recovery.ErrNotHTTP2):
				h.wantReason(r, "server_does_not_speak_http2_set_http_version")
			default:
				t.Fatalf("evidence %+v class %+v err %v", r.ev, r.c, r.err)
			}
			if !r.c.RouteMisconfigured {
				t.Fatalf("class %+v", r.c)
			}
			if n := tc.executed(); n != 0 {
				t.Fatalf("executed %d times", n)
			}
			next := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k-after-" + tc.name}, tc.url, false, nil)
			h.want(next, evidence.Completed)
			h.wantVersion(next, "HTTP/1.1")
		})
	}
}

// A route that asks for HTTP/2 over TLS at a server that speaks HTTP/1.1
// without ALPN (as cpp-httplib, llama.cpp's server, does) is unsent with
// the same reason. (A Go server that offers only http/1.1 refuses the
// handshake instead: dial_failed, unsent too.)
func TestHTTPVersion2AtHTTP1OnlyTLSServerIsUnsent(t *testing.T) {
	var served atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }))
	srv.TLS = &tls.Config{NextProtos: []string{}}
	srv.StartTLS()
	defer srv.Close()
	e := recovery.New(recovery.Config{TLSClientConfig: &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}, Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	h := &harness{t: t, e: e}
	r := h.send(recovery.WithHTTPVersion(t.Context(), recovery.HTTPVersion2), recovery.Spec{}, srv.URL, false, nil)
	h.want(r, evidence.Unsent)
	h.wantReason(r, "server_speaks_http1.1_set_http_version")
	if !errors.Is(r.err, recovery.ErrNoHTTP2) || served.Load() != 0 {
		t.Fatalf("err %v, served %d", r.err, served.Load())
	}
	auto := h.send(t.Context(), recovery.Spec{}, srv.URL, false, nil)
	h.want(auto, evidence.Completed)
	h.wantVersion(auto, "HTTP/1.1")
}

// An HTTP/1.1 request at an h2c-only server, whose first bytes are its
// SETTINGS frame (as x/net's server queues them on accepting), is unsent,
// naming http_version "2". The server here then reads until the client
// closes: x/net's own server closes at once on the bad preface, and the
// reset that sends may destroy its SETTINGS in flight, leaving a close
// with no answer, which HTTP/1.1 must call ambiguous.
func TestHTTP1AtH2COnlyServerIsUnsent(t *testing.T) {
	addr := serveLoopback(t, nil, func(c net.Conn) {
		_ = http2.NewFramer(c, c).WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
		_, _ = io.Copy(io.Discard, c)
	})
	e := recovery.New(recovery.Config{Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	h := &harness{t: t, e: e}
	r := h.send(t.Context(), recovery.Spec{}, "http://"+addr, false, nil)
	h.want(r, evidence.Unsent)
	h.wantReason(r, "server_speaks_only_http2_set_http_version")
	if !errors.Is(r.err, recovery.ErrSpeaksOnlyHTTP2) {
		t.Fatalf("err %v", r.err)
	}
}

// http_version "2" over http:// is h2c whatever AllowH2C says.
func TestHTTPVersion2OverHTTPIsH2CWithoutAllowH2C(t *testing.T) {
	h2s := &http2.Server{}
	addr := serveLoopback(t, nil, func(c net.Conn) {
		h2s.ServeConn(c, &http2.ServeConnOpts{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})})
	})
	e := recovery.New(recovery.Config{Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	h := &harness{t: t, e: e}
	ok := h.send(recovery.WithHTTPVersion(t.Context(), recovery.HTTPVersion2), recovery.Spec{}, "http://"+addr, false, nil)
	h.want(ok, evidence.Completed)
	h.wantVersion(ok, "HTTP/2.0")
}

// A 421 over HTTP/1.1 quarantines its connection: it never goes back to
// the pool, and the retry runs on a fresh connection, executed once.
func TestHTTP1MisdirectedQuarantinesTheConnection(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Misdirected())
	first := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-421"}, h.p.HTTP1URL(), false, nil)
	h.want(first, evidence.Misdirected)
	retry := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-421", FreshConnection: true, Avoid: []string{first.ev.ConnRef}}, h.p.HTTP1URL(), false, nil)
	h.want(retry, evidence.Completed)
	later := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-later"}, h.p.HTTP1URL(), false, nil)
	h.want(later, evidence.Completed)
	if !retry.ev.ConnFresh || later.ev.ConnRef == first.ev.ConnRef {
		t.Fatalf("the 421 connection was used again: first %s, retry %+v, later %+v", first.ev.ConnRef, retry.ev, later.ev)
	}
	h.executed("k-421", 1)
	if st := h.e.Stats(); st.Quarantines != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Probe says, without a request, what the engine will speak to each of
// the provider's listeners, and names a mismatch; an auto route learns
// HTTP/1.1 from it, so its first attempt is not spent on the mismatch.
func TestProbeSaysWhatTheServerSpeaks(t *testing.T) {
	h := newHarness(t) // AllowH2C: auto over http:// tries h2c
	auto, v2 := recovery.HTTPVersionAuto, recovery.HTTPVersion2
	for _, tc := range []struct {
		name, url string
		v         recovery.HTTPVersion
		want      recovery.Probe
	}{
		{"h2 over TLS", h.p.URL(), auto, recovery.Probe{Speaks: "HTTP/2.0", Checked: true}},
		{"h2c", h.p.H2CURL(), auto, recovery.Probe{Speaks: "HTTP/2.0", Checked: true}},
		{"http/1.1 over TLS", h.p.HTTP1TLSURL(), auto, recovery.Probe{Speaks: "HTTP/1.1", Checked: true}},
		{"2 at an HTTP/1.1 server", h.p.HTTP1URL(), v2, recovery.Probe{Speaks: "HTTP/2.0", Checked: true, Mismatch: evidence.MismatchHTTP11}},
		{"auto at an HTTP/1.1 server learns it", h.p.HTTP1URL(), auto, recovery.Probe{Speaks: "HTTP/1.1", Checked: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := h.e.Probe(t.Context(), tc.url+"/v1", tc.v)
			if err != nil || got != tc.want {
				t.Fatalf("probe %+v, %v; want %+v", got, err, tc.want)
			}
			if (got.Mismatch != "") != (got.Fix() != "") {
				t.Fatalf("fix %q for mismatch %q", got.Fix(), got.Mismatch)
			}
		})
	}
	if n := len(h.p.Received()); n != 0 {
		t.Fatalf("the probes sent %d requests", n)
	}
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k-after-probe"}, h.p.HTTP1URL(), false, nil)
	h.want(r, evidence.Completed)
	h.wantVersion(r, "HTTP/1.1")
}

// A context that ended before the send writes nothing, even when a
// kept-alive connection is ready: unsent, and the connection stays good.
func TestHTTP1ContextEndedBeforeTheSendWritesNothing(t *testing.T) {
	h := newHarness(t)
	warm := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "warm"}, h.p.HTTP1URL(), false, nil)
	h.want(warm, evidence.Completed)
	ctx, cancel := context.WithCancelCause(v11(t.Context()))
	cancel(recovery.ErrTimedOut)
	r := h.send(ctx, recovery.Spec{IdempotencyKey: "k-ended"}, h.p.HTTP1URL(), false, nil)
	h.want(r, evidence.Unsent)
	h.wantReason(r, "timeout_before_send")
	if n := receivedFor(h.p, r.ev.AttemptID); n != 0 {
		t.Fatalf("received %d", n)
	}
	next := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-next"}, h.p.HTTP1URL(), false, nil)
	h.want(next, evidence.Completed)
	if next.ev.ConnRef != warm.ev.ConnRef {
		t.Fatalf("the kept-alive connection was lost: %s then %s", warm.ev.ConnRef, next.ev.ConnRef)
	}
}

// Over TLS the server's close comes as a close_notify record, which the
// TLS layer may already have read with the last response, where the
// socket no longer shows it. The usability check sees it either way: the
// connection is discarded unwritten.
func TestHTTP1TLSCloseNotifyAfterTheResponseIsSeenBeforeTheWrite(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	certPEM, keyPEM, err := p.CertificatePEM()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{}, 4)
	var served atomic.Int32
	addr := serveLoopback(t, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		served.Add(1)
		// A keep-alive answer, then a close_notify right behind it.
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		c.Close()
		closed <- struct{}{}
	})
	e := recovery.New(recovery.Config{TLSClientConfig: &tls.Config{RootCAs: p.CertPool(), ServerName: "127.0.0.1"}, Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	h := &harness{t: t, e: e}
	url := "https://" + addr
	first := h.send(t.Context(), recovery.Spec{}, url, false, nil)
	h.want(first, evidence.Completed)
	<-closed
	second := h.send(t.Context(), recovery.Spec{}, url, false, nil)
	h.want(second, evidence.Completed)
	if !second.ev.ConnFresh {
		t.Fatalf("wrote to a connection the server had closed: %+v", second.ev)
	}
	if st := e.Stats(); st.HTTP1ClosedIdle != 1 || st.HTTP1RaceLost != 0 || served.Load() != 2 {
		t.Fatalf("stats %+v, served %d", st, served.Load())
	}
}

// The close_notify already inside the TLS layer: the server sends its
// answer and its close_notify in one segment and keeps the TCP connection
// open, so the socket shows nothing and only the TLS layer knows.
func TestHTTP1TLSCloseNotifyBufferedWithTheResponseIsSeenBeforeTheWrite(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	certPEM, keyPEM, _ := p.CertificatePEM()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{}, 4)
	addr := serveLoopback(t, nil, func(raw net.Conn) {
		hc := &holdConn{Conn: raw}
		tc := tls.Server(hc, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
		req, err := http.ReadRequest(bufio.NewReader(tc))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		hc.hold(true)
		_, _ = io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		_ = tc.CloseWrite()
		hc.hold(false)
		closed <- struct{}{}
		_, _ = io.Copy(io.Discard, raw) // the TCP side stays open until the client closes
	})
	e := recovery.New(recovery.Config{TLSClientConfig: &tls.Config{RootCAs: p.CertPool(), ServerName: "127.0.0.1"}, Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	h := &harness{t: t, e: e}
	url := "https://" + addr
	h.want(h.send(t.Context(), recovery.Spec{}, url, false, nil), evidence.Completed)
	<-closed
	second := h.send(t.Context(), recovery.Spec{}, url, false, nil)
	h.want(second, evidence.Completed)
	if st := e.Stats(); !second.ev.ConnFresh || st.HTTP1ClosedIdle != 1 || st.HTTP1RaceLost != 0 {
		t.Fatalf("wrote to a connection whose close_notify was buffered: %+v, stats %+v", second.ev, st)
	}
}

// holdConn holds writes while held and sends them in one write after.
type holdConn struct {
	net.Conn
	mu   sync.Mutex
	held bool
	buf  []byte
}

func (c *holdConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		c.buf = append(c.buf, b...)
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *holdConn) hold(v bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = v
	if !v && len(c.buf) > 0 {
		// tls.Conn.CloseWrite leaves a write deadline of "now" behind.
		_ = c.Conn.SetWriteDeadline(time.Time{})
		_, _ = c.Conn.Write(c.buf)
		c.buf = nil
	}
}

// serveLoopback serves each connection accepted on a fresh loopback port
// (over TLS when cfg is set) with serve, which need not close it, until
// the test ends; it returns the address.
func serveLoopback(t *testing.T, cfg *tls.Config, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// Closing an HTTP/1.1 body before its end cuts its connection at once, as
// a reset does over HTTP/2. net/http's body reads the rest on Close, and a
// server that keeps a finished stream open (keep-alive comments after
// [DONE]) never ends it: the attempt was held until its deadline and
// classified committed_partial, for a complete answer. Now it is
// completed, and the connection is never reused.
func TestAnHTTP1BodyClosedEarlyCutsItsConnection(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.AnswerThenKeepOpen("all of it"))
	// A close that drained would last until this deadline and then
	// classify as a timeout after content.
	ctx, cancel := context.WithTimeout(v11(t.Context()), 10*time.Second)
	defer cancel()
	a := recovery.NewAttempt(recovery.Spec{IdempotencyKey: "k-open"})
	req, err := http.NewRequestWithContext(recovery.WithAttempt(ctx, a), http.MethodPost, h.p.HTTP1URL()+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := h.e.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("body ended before [DONE]: %v", err)
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			break
		}
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ev, c := a.Finish(evidence.SignalNone)
	if c.Class != evidence.Completed || ev.TimedOut {
		t.Fatalf("classified %s (%s); evidence %+v", c.Class, c.Reason, ev)
	}
	next := h.send(v11(t.Context()), recovery.Spec{IdempotencyKey: "k-next"}, h.p.HTTP1URL(), false, nil)
	h.want(next, evidence.Completed)
	if !next.ev.ConnFresh || next.ev.ConnRef == ev.ConnRef {
		t.Fatalf("the cut connection was reused: %+v", next.ev)
	}
	h.executed("k-open", 1)
}

// OnTheWire, which the attempt journal's sent record and the worker's
// detach wait for, reads an HTTP/1.1 attempt's byte count while the
// exchange runs: false while the dial is still under way, true once the
// request is written and the server is generating. It asked only the
// HTTP/2 frame observer, so an HTTP/1.1 attempt was never on the wire
// until it ended, and a long local generation was never journaled sent.
func TestAnHTTP1AttemptIsOnTheWireWhileItsExchangeRuns(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dialing, dial := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e := recovery.New(recovery.Config{Logger: slog.New(slog.DiscardHandler), DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		once.Do(func() { close(dialing) })
		select {
		case <-dial:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}})
	defer e.Close()
	release := make(chan struct{})
	p.Push(providertest.Answer("generated slowly").WaitFor(release))
	a := recovery.NewAttempt(recovery.Spec{IdempotencyKey: "k-wire"})
	req, err := http.NewRequestWithContext(recovery.WithAttempt(v11(t.Context()), a), http.MethodPost, p.HTTP1URL()+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := e.RoundTrip(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	<-dialing
	if a.OnTheWire() {
		t.Fatal("on the wire while the dial is under way")
	}
	close(dial)
	waitFor(t, func() bool { return p.ExecutedCount("k-wire") == 1 })
	if !a.OnTheWire() {
		t.Fatal("an HTTP/1.1 attempt whose request the server has read is not on the wire")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ev, c := a.Finish(evidence.SignalNone)
	if c.Class != evidence.Completed || !a.OnTheWire() || !ev.RequestSent {
		t.Fatalf("classified %s; on the wire %v; evidence %+v", c.Class, a.OnTheWire(), ev)
	}
}
