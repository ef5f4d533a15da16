package recovery_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
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
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// These tests drive the engine over real HTTP/2 frames against the
// providertest provider on loopback TLS (and h2c), and check two things for
// each contract row: the classification the evidence yields, and the
// provider's own record of what it executed.

type harness struct {
	t   *testing.T
	p   *providertest.Provider
	e   *recovery.Engine
	log *bytes.Buffer
	mu  *sync.Mutex
}

func newHarness(t *testing.T, opts ...providertest.Option) *harness {
	t.Helper()
	p, err := providertest.NewProvider(opts...)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	mu := &sync.Mutex{}
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: mu}, nil))
	e := recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), AllowH2C: true, Logger: logger})
	t.Cleanup(func() {
		e.Close()
		p.Close()
	})
	return &harness{t: t, p: p, e: e, log: &buf, mu: mu}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// result is one attempt as the caller saw it.
type result struct {
	ev   evidence.Evidence
	c    evidence.Classification
	body string
	err  error
}

// send makes one attempt. read decides the provider-layer signal from the
// body, standing in for the provider adapters (a later issue); nil means
// none.
func (h *harness) send(ctx context.Context, spec recovery.Spec, url string, stream bool, read func(status int, body []byte) evidence.Signal) result {
	h.t.Helper()
	if spec.IdempotencyKey == "" {
		spec.IdempotencyKey = "key-" + h.t.Name()
	}
	a := recovery.NewAttempt(spec)
	payload := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
	req, err := http.NewRequestWithContext(recovery.WithAttempt(ctx, a), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(payload))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	var r result
	resp, err := h.e.RoundTrip(req)
	if err != nil {
		r.err = err
	} else {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		r.body, r.err = string(b), rerr
	}
	sig := evidence.SignalNone
	if read != nil && resp != nil {
		sig = read(resp.StatusCode, []byte(r.body))
	}
	r.ev, r.c = a.Finish(sig)
	return r
}

func (h *harness) want(r result, class evidence.Class) {
	h.t.Helper()
	if r.c.Class != class {
		h.t.Fatalf("classified %s (%s), want %s; evidence %+v; err %v", r.c.Class, r.c.Reason, class, r.ev, r.err)
	}
}

func (h *harness) executed(key string, want int) {
	h.t.Helper()
	if got := h.p.ExecutedCount(key); got != want {
		h.t.Fatalf("provider executed %q %d times, want %d", key, got, want)
	}
}

// openAISignal stands in for the provider layer: no choices means empty,
// an error type names incompatibility.
func openAISignal(status int, body []byte) evidence.Signal {
	if status >= 400 {
		var e struct {
			Error struct{ Type, Code string } `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		switch e.Error.Code {
		case "model_not_found":
			return evidence.SignalModelNotFound
		case "context_length_exceeded":
			return evidence.SignalContextTooLong
		}
		return evidence.SignalNone
	}
	var c struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if json.Unmarshal(body, &c) != nil || len(c.Choices) == 0 {
		return evidence.SignalEmptyResponse
	}
	return evidence.SignalNone
}

// Runbook 1: a request above the GOAWAY boundary is retried on a different
// connection and executes exactly once.
func TestRunbookGoAwayAboveBoundaryRetriedOnFreshConnection(t *testing.T) {
	for _, scheme := range []string{"tls", "h2c"} {
		t.Run(scheme, func(t *testing.T) {
			h := newHarness(t)
			url := h.p.URL()
			if scheme == "h2c" {
				url = h.p.H2CURL()
			}
			key := "key-runbook-1-" + scheme
			// Warm a connection so the GOAWAY'd request is on stream 3 with
			// stream 1 below the boundary.
			h.want(h.send(t.Context(), recovery.Spec{IdempotencyKey: "warm-" + scheme}, url, false, nil), evidence.Completed)

			h.p.Push(providertest.GoAwayAbove(http2.ErrCodeNo))
			first := h.send(t.Context(), recovery.Spec{IdempotencyKey: key, Attempt: 1}, url, false, nil)
			h.want(first, evidence.Refused)
			if first.ev.StreamID != 3 || first.ev.GoAway == nil || first.ev.GoAway.LastStreamID != 1 || first.ev.GoAway.Code != evidence.CodeNoError {
				t.Fatalf("evidence: stream %d goaway %+v", first.ev.StreamID, first.ev.GoAway)
			}
			if !first.c.Class.ReplaySafe() || !first.c.FreshConnection {
				t.Fatalf("classification %+v", first.c)
			}
			h.executed(key, 0)

			second := h.send(t.Context(), recovery.Spec{IdempotencyKey: key, Attempt: 2, Avoid: []string{first.ev.ConnRef}}, url, false, nil)
			h.want(second, evidence.Completed)
			if second.ev.ConnRef == first.ev.ConnRef || !second.ev.ConnFresh {
				t.Fatalf("retry used connection %s (fresh=%v), first was %s", second.ev.ConnRef, second.ev.ConnFresh, first.ev.ConnRef)
			}
			h.executed(key, 1)
		})
	}
}

// Runbook 2: a request at or below the GOAWAY boundary is ambiguous and
// the engine does not re-send it.
func TestRunbookGoAwayAtBoundaryIsAmbiguousAndNotResent(t *testing.T) {
	h := newHarness(t)
	key := "key-runbook-2"
	h.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo))
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: key, Attempt: 1}, h.p.URL(), false, nil)
	h.want(r, evidence.Ambiguous)
	if r.c.Reason != "goaway_at_or_below_boundary" || r.ev.GoAway.LastStreamID < r.ev.StreamID {
		t.Fatalf("reason %s, evidence %+v", r.c.Reason, r.ev)
	}
	h.executed(key, 1)
	if n := receivedFor(h.p, r.ev.AttemptID); n != 1 {
		t.Fatalf("provider received the attempt %d times; the engine must not re-send it", n)
	}
}

// Runbook 3: a connection lost with no GOAWAY is ambiguous.
func TestRunbookConnectionLossWithoutGoAwayIsAmbiguous(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.CloseAfterRead())
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k3"}, h.p.URL(), false, nil)
	h.want(r, evidence.Ambiguous)
	if r.c.Reason != "connection_closed_without_goaway" || !r.ev.ConnClosed || r.ev.GoAway != nil {
		t.Fatalf("reason %s evidence %+v", r.c.Reason, r.ev)
	}
	h.executed("k3", 1)
}

// Runbook 4: a 421 quarantines the connection and the retry succeeds on a
// fresh one; a second 421 on the fresh connection stops.
func TestRunbookMisdirectedThenFreshConnection(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Misdirected())
	first := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k4", Attempt: 1}, h.p.URL(), false, nil)
	h.want(first, evidence.Misdirected)

	// An unrelated request must not land on the quarantined connection.
	other := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k4-other"}, h.p.URL(), false, nil)
	h.want(other, evidence.Completed)
	if other.ev.ConnRef == first.ev.ConnRef {
		t.Fatal("a new stream went to a quarantined connection")
	}

	second := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k4", Attempt: 2, FreshConnection: true, AfterMisdirected: true, Avoid: []string{first.ev.ConnRef}}, h.p.URL(), false, nil)
	h.want(second, evidence.Completed)
	if !second.ev.ConnFresh || second.ev.ConnRef == first.ev.ConnRef || second.ev.ConnRef == other.ev.ConnRef {
		t.Fatalf("421 retry was not on a fresh connection: %s (first %s, other %s)", second.ev.ConnRef, first.ev.ConnRef, other.ev.ConnRef)
	}
	h.executed("k4", 1)
	if st := h.e.Stats(); st.Quarantines != 1 {
		t.Fatalf("quarantines = %d, want 1", st.Quarantines)
	}
}

func TestRunbookMisdirectedRepeatedStops(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Misdirected(), providertest.Misdirected())
	first := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k4r", Attempt: 1}, h.p.URL(), false, nil)
	h.want(first, evidence.Misdirected)
	second := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k4r", Attempt: 2, FreshConnection: true, AfterMisdirected: true}, h.p.URL(), false, nil)
	h.want(second, evidence.MisdirectedRepeated)
	h.executed("k4r", 0)
}

// Runbook 5: a stream whose content already started, then cut, is
// committed_partial with the partial text kept.
func TestRunbookStreamCutAfterContentIsCommittedPartial(t *testing.T) {
	for _, how := range []providertest.CutMode{providertest.CutReset, providertest.CutClose} {
		t.Run(how.String(), func(t *testing.T) {
			h := newHarness(t)
			h.p.Push(providertest.StreamCut(2, how))
			r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "k5"}, h.p.URL(), true, nil)
			h.want(r, evidence.CommittedPartial)
			if !r.ev.ContentStarted || r.ev.ResponseBytes == 0 || !strings.Contains(r.body, "data:") {
				t.Fatalf("partial content lost: evidence %+v body %q", r.ev, r.body)
			}
			h.executed("k5", 1)
		})
	}
}

func TestStreamStallAfterContentIsCommittedPartial(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.StreamStall(1))
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	a := recovery.NewAttempt(recovery.Spec{IdempotencyKey: "stall"})
	req, _ := http.NewRequestWithContext(recovery.WithAttempt(ctx, a), http.MethodPost, h.p.URL()+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	resp, err := h.e.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if n, err := resp.Body.Read(buf); n == 0 || err != nil {
		t.Fatalf("first chunk: %d %v", n, err)
	}
	// The caller's idle timer fires: it cancels with a cause that says
	// timeout.
	cancel(fmt.Errorf("stream idle: %w", recovery.ErrTimedOut))
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	ev, c := a.Finish(evidence.SignalNone)
	if c.Class != evidence.CommittedPartial || !ev.TimedOut {
		t.Fatalf("stall: %s (%s) %+v", c.Class, c.Reason, ev)
	}
}

func TestRefusedStream(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.RefuseStream())
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "rs"}, h.p.URL(), false, nil)
	h.want(r, evidence.Refused)
	if r.c.Reason != "rst_refused_stream" || r.ev.RSTStream == nil || *r.ev.RSTStream != evidence.CodeRefusedStream {
		t.Fatalf("%s %+v", r.c.Reason, r.ev)
	}
	h.executed("rs", 0)
}

func TestGoAwayCodesReadFromTheFrame(t *testing.T) {
	tests := []struct {
		code          http2.ErrCode
		class         evidence.Class
		misconfigured bool
	}{
		{http2.ErrCodeNo, evidence.Refused, false},
		{http2.ErrCodeEnhanceYourCalm, evidence.Throttled, false},
		{http2.ErrCodeProtocol, evidence.Refused, true},
		{http2.ErrCodeInadequateSecurity, evidence.Refused, true},
		{http2.ErrCodeHTTP11Required, evidence.Refused, true},
		{http2.ErrCodeInternal, evidence.Refused, true},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			h := newHarness(t)
			h.p.Push(providertest.GoAwayAbove(tt.code))
			r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "ga"}, h.p.URL(), false, nil)
			h.want(r, tt.class)
			if r.c.RouteMisconfigured != tt.misconfigured || r.ev.GoAway == nil || uint32(r.ev.GoAway.Code) != uint32(tt.code) {
				t.Fatalf("classification %+v evidence goaway %+v", r.c, r.ev.GoAway)
			}
			h.executed("ga", 0)
			if n := h.e.Stats().GoAways[r.ev.GoAway.Code.String()]; n != 1 {
				t.Fatalf("GOAWAY counter %d", n)
			}
		})
	}
}

// Two GOAWAYs on one connection: ENHANCE_YOUR_CALM and then a routine
// NO_ERROR must still read as ENHANCE_YOUR_CALM (throttled, back off), not
// as a graceful drain (docs/contract.md section 3.3: any non-NO_ERROR code seen
// counts).
func TestTwoGoAwaysForgetTheFirstCode(t *testing.T) {
	h := newHarness(t)
	h.want(h.send(t.Context(), recovery.Spec{IdempotencyKey: "warm"}, h.p.URL(), false, nil), evidence.Completed)
	h.p.Push(providertest.GoAwayAboveTwice(http2.ErrCodeEnhanceYourCalm, http2.ErrCodeNo))
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "twice"}, h.p.URL(), false, nil)
	h.want(r, evidence.Throttled)
	if r.c.Reason != "goaway_enhance_your_calm" || r.ev.GoAway == nil || *r.ev.GoAway != (evidence.GoAway{LastStreamID: 1, Code: evidence.CodeEnhanceYourCalm, DebugLen: len("durallm-providertest")}) {
		t.Fatalf("reason %s, goaway %+v", r.c.Reason, r.ev.GoAway)
	}
	h.executed("twice", 0)
	// Each frame is still counted under its own code.
	if st := h.e.Stats(); st.GoAways["ENHANCE_YOUR_CALM"] != 1 || st.GoAways["NO_ERROR"] != 1 {
		t.Fatalf("GOAWAY counters %v", st.GoAways)
	}
}

func TestStatusRows(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name       string
		b          providertest.Behavior
		class      evidence.Class
		retryAfter time.Duration // exact, or -1 for "a positive value"
		executed   int
	}{
		{"throttled: 429 Retry-After seconds", providertest.TooManyRequests(providertest.RetryAfterSeconds(3)), evidence.Throttled, 3 * time.Second, 0},
		{"throttled: 429 Retry-After HTTP-date", providertest.TooManyRequests(providertest.RetryAfterDate(now.Add(time.Hour))), evidence.Throttled, -1, 0},
		{"throttled: 429 retry-after-ms", providertest.TooManyRequests(providertest.RetryAfterMS(1500)), evidence.Throttled, 1500 * time.Millisecond, 0},
		{"throttled: 503 garbage Retry-After is no hint", providertest.Unavailable(providertest.RetryAfterRaw("soonish")), evidence.Throttled, 0, 0},
		{"throttled: 503 negative Retry-After is no hint", providertest.Unavailable(providertest.RetryAfterRaw("-4")), evidence.Throttled, 0, 0},
		{"upstream_error: 500", providertest.ServerError(500), evidence.UpstreamError, 0, 1},
		{"upstream_error: 502", providertest.ServerError(502), evidence.UpstreamError, 0, 1},
		{"ambiguous: 504", providertest.ServerError(504), evidence.Ambiguous, 0, 1},
		{"rejected: 400", providertest.Status(400, nil, `{"error":{"type":"invalid_request_error","message":"bad"}}`), evidence.Rejected, 0, 0},
		{"rejected: 401", providertest.Status(401, nil, `{"error":{"type":"authentication_error"}}`), evidence.Rejected, 0, 0},
		{"incompatible_route: model not found", providertest.Status(404, nil, `{"error":{"type":"invalid_request_error","code":"model_not_found"}}`), evidence.IncompatibleRoute, 0, 0},
		{"incompatible_route: context too long", providertest.Status(400, nil, `{"error":{"type":"invalid_request_error","code":"context_length_exceeded"}}`), evidence.IncompatibleRoute, 0, 0},
		{"empty_response: 200 with an empty body", providertest.EmptyBody(), evidence.EmptyResponse, 0, 1},
		{"empty_response: 200 with no choices", providertest.NoChoices(), evidence.EmptyResponse, 0, 1},
		{"completed", providertest.Answer("hello there"), evidence.Completed, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.p.Push(tt.b)
			r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "st"}, h.p.URL(), false, openAISignal)
			h.want(r, tt.class)
			switch {
			case tt.retryAfter < 0 && r.c.RetryAfter <= 0:
				t.Fatalf("RetryAfter %v, want positive", r.c.RetryAfter)
			case tt.retryAfter >= 0 && r.c.RetryAfter != tt.retryAfter:
				t.Fatalf("RetryAfter %v, want %v", r.c.RetryAfter, tt.retryAfter)
			}
			h.executed("st", tt.executed)
		})
	}
}

func TestUnsentWhenDialFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	h := newHarness(t)
	r := h.send(t.Context(), recovery.Spec{}, "https://"+addr, false, nil)
	h.want(r, evidence.Unsent)
	if !r.ev.DialFailed || r.ev.RequestSent {
		t.Fatalf("%+v", r.ev)
	}
}

func TestTimeoutAfterSendIsAmbiguous(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Hold())
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	r := h.send(ctx, recovery.Spec{IdempotencyKey: "hold"}, h.p.URL(), false, nil)
	h.want(r, evidence.Ambiguous)
	if r.c.Reason != "timeout_after_send" || !r.ev.TimedOut || !r.ev.RequestSent {
		t.Fatalf("%s %+v", r.c.Reason, r.ev)
	}
	h.executed("hold", 1)
}

func TestCancelWithACauseIsStillCanceled(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Hold())
	ctx, cancel := context.WithCancelCause(t.Context())
	done := make(chan result, 1)
	go func() { done <- h.send(ctx, recovery.Spec{IdempotencyKey: "cause"}, h.p.URL(), false, nil) }()
	waitFor(t, func() bool { return h.p.ExecutedCount("cause") == 1 })
	cancel(errors.New("activity canceled by the workflow"))
	h.want(<-done, evidence.Canceled)
}

func TestCancelIsNeverAProviderFailure(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Hold())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan result, 1)
	go func() { done <- h.send(ctx, recovery.Spec{IdempotencyKey: "cancel"}, h.p.URL(), false, nil) }()
	waitFor(t, func() bool { return h.p.ExecutedCount("cancel") == 1 })
	cancel()
	r := <-done
	h.want(r, evidence.Canceled)
	if r.c.ProviderHealth {
		t.Fatal("cancellation moved provider health")
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("error %v does not wrap context.Canceled", r.err)
	}
}

// A transport error wrapped by another layer, under a misleading label, is
// classified by the evidence, not by the wrapper.
func TestWrappedTransportErrorClassifiedByEvidence(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.GoAwayAbove(http2.ErrCodeNo))
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "wrapped"}, h.p.URL(), false, nil)
	wrapped := fmt.Errorf("rpc error: code = InvalidArgument desc = %w", r.err)
	var ae *recovery.AttemptError
	if !errors.As(wrapped, &ae) || ae.AttemptID != r.ev.AttemptID {
		t.Fatalf("the attempt cannot be found through the wrapper: %v", wrapped)
	}
	h.want(r, evidence.Refused) // not "rejected", whatever the label says
}

// A hidden replay: x/net's own Transport re-sends a request above a GOAWAY
// boundary when GetBody is set. The observer catches it; the engine never
// does it.
func TestHiddenReplayIsCaughtAndTheEngineNeverReplays(t *testing.T) {
	h := newHarness(t)

	// The bare transport, observed.
	obs := recovery.NewObserver()
	var seq int
	var seqMu sync.Mutex
	bare := &http2.Transport{
		TLSClientConfig: h.p.ClientTLSConfig(),
		DialTLSContext: func(ctx context.Context, network, addr string, cfg *tls.Config) (net.Conn, error) {
			c, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			seqMu.Lock()
			seq++
			ref := fmt.Sprintf("bare-c%d", seq)
			seqMu.Unlock()
			return obs.WrapConn(c, ref, recovery.ConnHooks{}), nil
		},
	}
	defer bare.CloseIdleConnections()
	h.p.Push(providertest.GoAwayAbove(http2.ErrCodeNo))
	obs.Track("bare-attempt")
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.p.URL()+"/v1/chat/completions", strings.NewReader(`{}`))
	req.Header.Set(recovery.HeaderAttemptID, "bare-attempt")
	req.Header.Set(recovery.HeaderIdempotencyKey, "bare")
	if resp, err := bare.RoundTrip(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	f := obs.Stream("bare-attempt", nil)
	if f.Streams < 2 {
		t.Fatalf("the bare transport did not replay (streams=%d); the scenario no longer shows a hidden replay", f.Streams)
	}

	// The engine, same scenario.
	h.p.Push(providertest.GoAwayAbove(http2.ErrCodeNo))
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "engine"}, h.p.URL(), false, nil)
	h.want(r, evidence.Refused)
	if r.ev.TransportReplays != 0 || receivedFor(h.p, r.ev.AttemptID) != 1 {
		t.Fatalf("engine replayed: replays=%d received=%d", r.ev.TransportReplays, receivedFor(h.p, r.ev.AttemptID))
	}
	h.executed("engine", 0)
}

// A drain of many in-flight streams turns into one reconnect, not a storm.
func TestDrainReconnectsWithinTheAuthorityLimit(t *testing.T) {
	h := newHarness(t)
	h.p.SetDefault(providertest.Answer("ok").After(20 * time.Millisecond))
	const n = 64
	var wg sync.WaitGroup
	results := make([]result, n)
	start := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = h.send(t.Context(), recovery.Spec{IdempotencyKey: fmt.Sprintf("d%d", i)}, h.p.URL(), false, nil)
		}()
	}
	for i := range n / 2 {
		start(i)
	}
	// Drain while the first half is in flight, then send the rest.
	waitFor(t, func() bool { return len(h.p.Received()) >= n/2 })
	h.p.Drain(http2.ErrCodeNo)
	// Once the engine has read the GOAWAY, no new stream may go to that
	// connection: the second half must reconnect.
	waitFor(t, func() bool { return h.e.Stats().GoAways["NO_ERROR"] == 1 })
	for i := n / 2; i < n; i++ {
		start(i)
	}
	wg.Wait()
	counts := map[evidence.Class]int{}
	for _, r := range results {
		counts[r.c.Class]++
		if r.c.Class == evidence.Completed || r.c.Class == evidence.Refused || r.c.Class == evidence.Unsent {
			continue
		}
		t.Errorf("unexpected %s (%s)", r.c.Class, r.c.Reason)
	}
	if got := h.p.ConnsAccepted(); got < 2 || got > 1+4 {
		t.Fatalf("%d connections for one drain; want a reconnect within the per-authority limit of 4", got)
	}
	for i, r := range results[n/2:] {
		if r.c.Class != evidence.Completed {
			t.Errorf("request %d sent after the GOAWAY was read: %s (%s)", n/2+i, r.c.Class, r.c.Reason)
		}
	}
	for i, r := range results {
		if r.c.Class == evidence.Completed && h.p.ExecutedCount(fmt.Sprintf("d%d", i)) != 1 {
			t.Errorf("d%d completed but executed %d times", i, h.p.ExecutedCount(fmt.Sprintf("d%d", i)))
		}
	}
	t.Logf("classes %v, connections %d", counts, h.p.ConnsAccepted())
}

// The attempt event carries the contract's fields and none of the
// request's content, headers or GOAWAY debug data.
func TestAttemptEventIsSanitized(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.GoAwayAbove(http2.ErrCodeNo))
	a := recovery.NewAttempt(recovery.Spec{ActionRef: "act-1", Attempt: 1, Route: "primary", IdempotencyKey: "idem-secret-key"})
	req, _ := http.NewRequestWithContext(recovery.WithAttempt(t.Context(), a), http.MethodPost, h.p.URL()+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"PROMPT-CANARY"}]}`))
	req.Header.Set("Authorization", "Bearer sk-KEY-CANARY")
	if resp, err := h.e.RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	a.Finish(evidence.SignalNone)
	h.mu.Lock()
	out := h.log.String()
	h.mu.Unlock()
	for _, secret := range []string{"PROMPT-CANARY", "sk-KEY-CANARY", "Bearer", "durallm-providertest", "idem-secret-key"} {
		if strings.Contains(out, secret) {
			t.Errorf("log holds %q: %s", secret, out)
		}
	}
	// The error a caller gets says GOAWAY without the debug data either.
	h.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo))
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "sanitized"}, h.p.URL(), false, nil)
	if r.err == nil || strings.Contains(r.err.Error(), "durallm-providertest") || !strings.Contains(r.err.Error(), "GOAWAY") {
		t.Errorf("error %v: want GOAWAY named, without its debug data", r.err)
	}
	var ev map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &ev); err != nil {
		t.Fatalf("want exactly one JSON event, got %q: %v", out, err)
	}
	for _, field := range []string{"action_ref", "attempt", "route", "authority", "http_version", "conn_ref", "stream_id", "request_bytes", "response_headers", "content_started", "response_bytes", "goaway_last_stream_id", "goaway_code", "status", "retry_after", "elapsed", "classification", "reason"} {
		if _, ok := ev[field]; !ok {
			t.Errorf("event lacks %q: %s", field, out)
		}
	}
	if ev["msg"] != evidence.AttemptEvent || ev["classification"] != "refused" {
		t.Errorf("event %v", ev)
	}
}

// A body read that fails is sanitized like RoundTrip's errors: a GOAWAY
// after part of the body fails the read with x/net's GoAwayError, whose
// text holds the debug data. The read's error is an *AttemptError that
// names the GOAWAY without it, and the GoAwayError stays reachable; a
// clean end stays a bare io.EOF (io.ReadAll and bufio compare with ==).
func TestBodyReadErrorIsSanitized(t *testing.T) {
	for _, tc := range []struct {
		name   string
		b      providertest.Behavior
		stream bool
	}{
		{"stream", providertest.StreamCut(1, providertest.CutGoAway), true},
		{"json", providertest.BodyCut(200, nil, `{"id":"x","choices":[`, providertest.CutGoAway), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.p.Push(tc.b)
			r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "body-" + tc.name}, h.p.URL(), tc.stream, nil)
			if r.err == nil || r.body == "" {
				t.Fatalf("err %v body %q: want part of the body, then an error", r.err, r.body)
			}
			if strings.Contains(r.err.Error(), "durallm-providertest") || !strings.Contains(r.err.Error(), "GOAWAY") {
				t.Errorf("error %v: want GOAWAY named, without its debug data", r.err)
			}
			var ae *recovery.AttemptError
			var ga http2.GoAwayError
			if !errors.As(r.err, &ae) || ae.AttemptID != r.ev.AttemptID || !errors.As(r.err, &ga) {
				t.Errorf("error %v: want an AttemptError of this attempt wrapping the GoAwayError", r.err)
			}
			h.want(r, evidence.CommittedPartial)
		})
	}
	// A clean end is io.EOF itself.
	h := newHarness(t)
	a := recovery.NewAttempt(recovery.Spec{IdempotencyKey: "clean"})
	req, _ := http.NewRequestWithContext(recovery.WithAttempt(t.Context(), a), http.MethodPost, h.p.URL()+"/v1/chat/completions", strings.NewReader(`{}`))
	resp, err := h.e.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1<<16)
	for err == nil {
		_, err = resp.Body.Read(buf)
	}
	if err != io.EOF {
		t.Fatalf("clean end: %#v, want io.EOF itself", err)
	}
}

func TestAttemptCannotBeSentTwice(t *testing.T) {
	h := newHarness(t)
	a := recovery.NewAttempt(recovery.Spec{})
	for i := range 2 {
		req, _ := http.NewRequestWithContext(recovery.WithAttempt(t.Context(), a), http.MethodPost, h.p.URL()+"/v1/chat/completions", strings.NewReader(`{}`))
		resp, err := h.e.RoundTrip(req)
		if i == 0 {
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			continue
		}
		if !errors.Is(err, recovery.ErrAttemptReused) {
			t.Fatalf("second send: %v, want ErrAttemptReused", err)
		}
	}
}

func receivedFor(p *providertest.Provider, attemptID string) int {
	n := 0
	for _, r := range p.Received() {
		if r.AttemptID == attemptID {
			n++
		}
	}
	return n
}

// waitFor polls a condition with a generous bound; it never asserts time.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never became true")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An idempotency key the client cannot encode (CR/LF in it) made every
// attempt unsent until the budget ran out. The engine refuses it before
// sending, and the request is rejected: retrying can never help.
func TestIdempotencyKeyTheClientCannotEncodeIsRejected(t *testing.T) {
	h := newHarness(t)
	r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "order-42\r\nX-Injected: 1", Attempt: 1}, h.p.URL(), false, nil)
	h.want(r, evidence.Rejected)
	if !errors.Is(r.err, recovery.ErrUnsendable) || r.c.Reason != "invalid_request" {
		t.Fatalf("err %v, reason %s", r.err, r.c.Reason)
	}
	if strings.Contains(r.err.Error(), "order-42") {
		t.Fatalf("the error quotes the key: %v", r.err)
	}
	if got := len(h.p.Received()); got != 0 {
		t.Fatalf("the provider received %d requests", got)
	}
}

// Response HEADERS (a 103) and then REFUSED_STREAM were classified
// refused: once the server sent response headers it acted on the stream,
// so the attempt is ambiguous, and the provider's record shows why.
func TestResponseHeadersThenRefusedStreamIsAmbiguous(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.HintsThenRefuse())
	r := h.send(t.Context(), recovery.Spec{Attempt: 1}, h.p.URL(), false, nil)
	h.want(r, evidence.Ambiguous)
	if !r.ev.ResponseHeaders || r.ev.RSTStream == nil || *r.ev.RSTStream != evidence.CodeRefusedStream || r.c.Reason != "rst_refused_stream_after_response_headers" {
		t.Fatalf("evidence %+v, reason %s", r.ev, r.c.Reason)
	}
	if n := h.p.AttemptExecutions(r.ev.AttemptID); n != 1 {
		t.Fatalf("the provider executed it %d times; a resend would have been a duplicate", n)
	}
}
