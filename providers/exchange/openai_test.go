package exchange_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// These tests make real attempts through the recovery engine against the
// providertest provider over loopback TLS. Timeouts in them are short so the
// tests are fast; no assertion depends on how long anything took.

// short is the timer value for tests that wait for a timer to fire.
const short = 100 * time.Millisecond

type harness struct {
	t   *testing.T
	p   *providertest.Provider
	e   *recovery.Engine
	mu  sync.Mutex
	log bytes.Buffer // the engine's attempt events
	// adapter makes the attempts: CallOpenAI unless a test says otherwise.
	adapter func(context.Context, http.RoundTripper, exchange.Call) (exchange.Result, error)
	// manual makes every attempt ManualCommit, as the CallModel activity
	// does; by default only streams are.
	manual bool
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, p: p, adapter: exchange.CallOpenAI}
	logger := slog.New(slog.NewJSONHandler(lockedWriter{h}, nil))
	h.e = recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: logger})
	// An attempt that never reached the engine (refused before sending)
	// logs through the default logger: capture that too. The tests of this
	// package do not run in parallel.
	prev := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() {
		slog.SetDefault(prev)
		h.e.Close()
		p.Close()
	})
	return h
}

type lockedWriter struct{ h *harness }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	return w.h.log.Write(b)
}

func (h *harness) logText() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.String()
}

// route is a loopback route to the provider, without a key source.
func (h *harness) route() routes.Route {
	return routes.Route{Name: "testsuite", Kind: routes.KindOpenAI, BaseURL: h.p.URL() + "/v1", Model: "m-test"}
}

// recSink records what a stream delivered.
type recSink struct {
	mu         sync.Mutex
	deltas     []string
	incomplete []string
	onDelta    func()
}

func (s *recSink) Delta(text string) {
	s.mu.Lock()
	s.deltas = append(s.deltas, text)
	f := s.onDelta
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

func (s *recSink) Incomplete(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.incomplete = append(s.incomplete, reason)
}

func (s *recSink) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.deltas, "")
}

// outcome is one attempt as the activity would see it.
type outcome struct {
	res exchange.Result
	err error
	ev  evidence.Evidence
	c   evidence.Classification
}

func (h *harness) call(ctx context.Context, route routes.Route, req providers.Request, sink exchange.Sink) outcome {
	h.t.Helper()
	a := recovery.NewAttempt(recovery.Spec{
		ActionRef: "act-" + h.t.Name(), Attempt: 1, Route: route.Name,
		IdempotencyKey: "key-" + h.t.Name(), ManualCommit: req.Stream || h.manual,
		Intermediary: route.Intermediary, HonoursIdempotencyKey: route.HonoursIdempotencyKey,
	})
	var o outcome
	o.res, o.err = h.adapter(recovery.WithAttempt(ctx, a), h.e, exchange.Call{Route: route, Request: req, Sink: sink})
	o.ev, o.c = a.Finish(o.res.Signal)
	return o
}

func (o outcome) want(t *testing.T, class evidence.Class) {
	t.Helper()
	if o.c.Class != class {
		t.Fatalf("classified %s (%s), want %s\nevidence %+v\nsignal %q err %v", o.c.Class, o.c.Reason, class, o.ev, o.res.Signal, o.err)
	}
}

func chat(stream bool) providers.Request {
	return providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hello there")}, Stream: stream}
}

// capture records the body and headers of the next request and answers it
// with b.
func capture(p *providertest.Provider, b providertest.Behavior) (get func() providertest.Request) {
	var mu sync.Mutex
	var got providertest.Request
	p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		got = r
		mu.Unlock()
		return b, true
	})
	return func() providertest.Request {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}

func TestAnswerNonStreaming(t *testing.T) {
	h := newHarness(t)
	got := capture(h.p, providertest.Answer("hello world"))
	req := chat(false)
	req.Params = map[string]json.RawMessage{"temperature": json.RawMessage(`0.1`)}
	o := h.call(context.Background(), h.route(), req, nil)
	if o.err != nil {
		t.Fatal(o.err)
	}
	o.want(t, evidence.Completed)
	r := o.res.Response
	if r.Text != "hello world" || r.FinishReason != "stop" || r.ID == "" || r.Model != "durallm-test" || r.Usage.TotalTokens == 0 || r.Raw == nil || r.Partial {
		t.Fatalf("response %+v", r)
	}
	if !o.ev.ContentStarted || o.res.Signal != evidence.SignalNone {
		t.Fatalf("not committed or signalled: %+v %q", o.ev, o.res.Signal)
	}
	sent := got()
	if sent.Path != "/v1/chat/completions" || sent.Method != http.MethodPost || sent.Model != "m-test" || sent.Stream {
		t.Fatalf("request %s %s model %q stream %v", sent.Method, sent.Path, sent.Model, sent.Stream)
	}
	if sent.Header.Get("Authorization") != "" {
		t.Fatal("Authorization sent for a route without a key source")
	}
	if ct := sent.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var body map[string]any
	if err := json.Unmarshal(sent.Body, &body); err != nil {
		t.Fatal(err)
	}
	if body["temperature"] != 0.1 || body["stream"] != nil || body["messages"] == nil {
		t.Fatalf("body %s", sent.Body)
	}
	if h.p.ExecutedCount("key-"+t.Name()) != 1 {
		t.Fatal("not executed exactly once")
	}
}

func TestAnswerStreaming(t *testing.T) {
	h := newHarness(t)
	got := capture(h.p, providertest.Answer("the quick brown fox"))
	sink := &recSink{}
	o := h.call(context.Background(), h.route(), chat(true), sink)
	if o.err != nil {
		t.Fatal(o.err)
	}
	o.want(t, evidence.Completed)
	r := o.res.Response
	if r.Text != "the quick brown fox" || r.FinishReason != "stop" || r.Usage.TotalTokens == 0 || r.Partial || r.Raw != nil {
		t.Fatalf("response %+v", r)
	}
	if len(sink.deltas) != 4 || sink.text() != r.Text || len(sink.incomplete) != 0 {
		t.Fatalf("sink got %q, incomplete %q", sink.deltas, sink.incomplete)
	}
	if !o.ev.ContentStarted {
		t.Fatal("the first delta did not commit the attempt")
	}
	var body map[string]any
	if err := json.Unmarshal(got().Body, &body); err != nil {
		t.Fatal(err)
	}
	if body["stream"] != true || fmt.Sprint(body["stream_options"]) != "map[include_usage:true]" {
		t.Fatalf("body %s", got().Body)
	}
}

func TestAuthorizationFromKeyFile(t *testing.T) {
	h := newHarness(t)
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte("sk-test-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := capture(h.p, providertest.Answer("ok"))
	route := h.route()
	route.APIKeyFile = file
	o := h.call(context.Background(), route, chat(false), nil)
	if o.err != nil {
		t.Fatal(o.err)
	}
	if a := got().Header.Get("Authorization"); a != "Bearer sk-test-123" {
		t.Fatalf("Authorization %q", a)
	}
	if got().IdempotencyKey != "key-"+t.Name() || got().AttemptID == "" {
		t.Fatal("the engine's idempotency and attempt headers are missing")
	}
}

func TestEmptyResponses(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    providertest.Behavior
	}{
		{"empty body", providertest.EmptyBody()},
		{"no choices", providertest.NoChoices()},
		{"empty content", providertest.Answer("")},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				h := newHarness(t)
				h.p.Push(tc.b)
				o := h.call(context.Background(), h.route(), chat(stream), &recSink{})
				if o.err != nil {
					t.Fatal(o.err)
				}
				if o.res.Signal != evidence.SignalEmptyResponse {
					t.Fatalf("signal %q", o.res.Signal)
				}
				o.want(t, evidence.EmptyResponse)
				if stream && o.ev.ContentStarted {
					t.Fatal("a stream with no content committed")
				}
			})
		}
	}
}

// Through the engine: a 200 chat completion that says in_progress or
// queued and carries nothing is empty_response (fall back), not completed.
func TestInProgressChatCompletionIsEmptyResponse(t *testing.T) {
	for _, status := range []string{"in_progress", "queued"} {
		t.Run(status, func(t *testing.T) {
			h := newHarness(t)
			h.manual = true
			h.p.Push(providertest.Status(200, nil, `{"id":"chatcmpl-1","object":"chat.completion","status":"`+status+`","choices":[]}`))
			o := h.call(context.Background(), h.route(), chat(false), nil)
			if o.err != nil || o.res.Signal != evidence.SignalEmptyResponse || o.res.Response.Status != status {
				t.Fatalf("err %v signal %q status %q", o.err, o.res.Signal, o.res.Response.Status)
			}
			o.want(t, evidence.EmptyResponse)
			if o.ev.ContentStarted {
				t.Fatal("an empty answer committed")
			}
		})
	}
}

func TestErrorStatusMapping(t *testing.T) {
	errBody := func(typ, code, msg string) string {
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"type": typ, "code": code, "message": msg, "param": nil}})
		return string(b)
	}
	cases := []statusCase{
		{"model not found", providertest.Status(404, nil, errBody("invalid_request_error", "model_not_found", "The model does not exist")), evidence.SignalModelNotFound, evidence.IncompatibleRoute},
		{"context length code", providertest.Status(400, nil, errBody("invalid_request_error", "context_length_exceeded", "too long")), evidence.SignalContextTooLong, evidence.IncompatibleRoute},
		{"context length message", providertest.Status(400, nil, `{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","code":null}}`), evidence.SignalContextTooLong, evidence.IncompatibleRoute},
		{"overloaded 529", providertest.Status(529, nil, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`), evidence.SignalOverloaded, evidence.Throttled},
		{"server_overloaded on a 500", providertest.Status(500, nil, errBody("server_overloaded", "", "busy")), evidence.SignalOverloaded, evidence.Throttled},
		{"content filter", providertest.Status(400, nil, errBody("invalid_request_error", "content_filter", "filtered")), evidence.SignalContentFiltered, evidence.ContentFiltered},
		{"content policy", providertest.Status(400, nil, errBody("invalid_request_error", "content_policy_violation", "policy")), evidence.SignalContentFiltered, evidence.ContentFiltered},
		{"bad key", providertest.Status(401, nil, errBody("invalid_request_error", "invalid_api_key", "Incorrect API key")), evidence.SignalNone, evidence.Rejected},
		{"rate limited", providertest.TooManyRequests(providertest.RetryAfterSeconds(2)), evidence.SignalNone, evidence.Throttled},
		{"html 502", providertest.Status(502, http.Header{"Content-Type": {"text/html"}}, "<html>bad gateway</html>"), evidence.SignalNone, evidence.UpstreamError},
		{"gateway timeout", providertest.ServerError(504), evidence.SignalNone, evidence.Ambiguous},
	}
	checkStatusCases(t, cases, newHarness, (*harness).route)
}

// On a route marked intermediary, a 502 the proxy generated itself (its
// body is not the provider's error object: HTML, or nothing, as Caddy
// sends) is ambiguous, not retried: the proxy may have forwarded the
// request before it failed. The provider's own 502, in its error shape,
// stays upstream_error, as does any 502 on a route whose provider
// deduplicates by Idempotency-Key; a 503 stays throttled.
func TestA502FromAnIntermediaryIsAmbiguous(t *testing.T) {
	intermediary := func(h *harness) routes.Route {
		r := h.route()
		r.Intermediary = true
		return r
	}
	checkStatusCases(t, []statusCase{
		{"proxy's html 502", providertest.Status(502, http.Header{"Content-Type": {"text/html"}}, "<html>502 Bad Gateway</html>"), evidence.SignalNone, evidence.Ambiguous},
		{"proxy's empty 502", providertest.Status(502, nil, ""), evidence.SignalNone, evidence.Ambiguous},
		{"provider's own 502", providertest.ServerError(502), evidence.SignalNone, evidence.UpstreamError},
		{"503 with Retry-After", providertest.Unavailable(providertest.RetryAfterSeconds(1)), evidence.SignalNone, evidence.Throttled},
	}, newHarness, intermediary)
	checkStatusCases(t, []statusCase{
		{"proxy's html 502, idempotent provider", providertest.Status(502, http.Header{"Content-Type": {"text/html"}}, "<html>502 Bad Gateway</html>"), evidence.SignalNone, evidence.UpstreamError},
	}, newHarness, func(h *harness) routes.Route {
		r := intermediary(h)
		r.HonoursIdempotencyKey, r.IdempotencyWindow = true, time.Hour
		return r
	})
}

// statusCase is an HTTP error answer and how it must end.
type statusCase struct {
	name   string
	b      providertest.Behavior
	signal evidence.Signal
	class  evidence.Class
}

// checkStatusCases runs each case, streaming and not, on a fresh harness:
// an error status is a Result with a signal, never a Go error, and never
// reaches the sink or commits.
func checkStatusCases(t *testing.T, cases []statusCase, newH func(*testing.T) *harness, route func(*harness) routes.Route) {
	t.Helper()
	for _, tc := range cases {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				h := newH(t)
				h.p.Push(tc.b)
				sink := &recSink{}
				o := h.call(context.Background(), route(h), chat(stream), sink)
				if o.err != nil {
					t.Fatalf("an HTTP error status is not a Go error: %v", o.err)
				}
				if o.res.Signal != tc.signal {
					t.Fatalf("signal %q, want %q", o.res.Signal, tc.signal)
				}
				o.want(t, tc.class)
				if len(sink.deltas) != 0 || o.ev.ContentStarted {
					t.Fatal("an error body reached the sink or committed")
				}
			})
		}
	}
}

func TestStallAfterFirstChunkIsPartial(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.StreamStall(1))
	route := h.route()
	route.IdleTimeout = short
	sink := &recSink{}
	o := h.call(context.Background(), route, chat(true), sink)
	if o.err != nil {
		t.Fatalf("a committed stream that stalls is a partial result, not an error: %v", o.err)
	}
	r := o.res.Response
	if !r.Partial || r.Incomplete != providers.IncompleteIdleTimeout || r.Text != "chunk1" {
		t.Fatalf("response %+v", r)
	}
	if sink.text() != "chunk1" || len(sink.incomplete) != 1 || sink.incomplete[0] != "idle_timeout" {
		t.Fatalf("sink %q incomplete %q", sink.deltas, sink.incomplete)
	}
	o.want(t, evidence.CommittedPartial)
	if !o.ev.TimedOut || !o.ev.ContentStarted {
		t.Fatalf("evidence %+v", o.ev)
	}
}

func TestCutAfterContentIsPartial(t *testing.T) {
	for _, tc := range []struct {
		how    providertest.CutMode
		reason string
	}{
		{providertest.CutReset, providers.IncompleteReset},
		{providertest.CutClose, providers.IncompleteConnectionClosed},
	} {
		t.Run(tc.how.String(), func(t *testing.T) {
			h := newHarness(t)
			h.p.Push(providertest.StreamCut(2, tc.how))
			sink := &recSink{}
			o := h.call(context.Background(), h.route(), chat(true), sink)
			if o.err != nil {
				t.Fatal(o.err)
			}
			r := o.res.Response
			if !r.Partial || r.Incomplete != tc.reason || r.Text != "chunk1 chunk2" || sink.text() != r.Text {
				t.Fatalf("response %+v, sink %q", r, sink.deltas)
			}
			if len(sink.incomplete) != 1 || sink.incomplete[0] != tc.reason {
				t.Fatalf("sink incomplete %q", sink.incomplete)
			}
			o.want(t, evidence.CommittedPartial)
		})
	}
}

func TestFirstByteTimeoutBeforeContent(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    providertest.Behavior
	}{
		{"no response at all", providertest.Hold()},
		{"headers but no body", providertest.StreamStall(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.p.Push(tc.b)
			route := h.route()
			route.FirstByteTimeout = short
			sink := &recSink{}
			o := h.call(context.Background(), route, chat(true), sink)
			if !errors.Is(o.err, exchange.ErrFirstByteTimeout) {
				t.Fatalf("err = %v, want ErrFirstByteTimeout", o.err)
			}
			var ae *recovery.AttemptError
			if tc.name == "no response at all" && !errors.As(o.err, &ae) {
				t.Fatalf("the engine's AttemptError is not reachable through %v", o.err)
			}
			o.want(t, evidence.Ambiguous)
			if !o.ev.TimedOut || o.ev.ContentStarted || o.res.Response.Partial || len(sink.incomplete) != 0 {
				t.Fatalf("evidence %+v result %+v", o.ev, o.res)
			}
		})
	}
}

func TestAttemptTimeoutNonStreaming(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Hold())
	route := h.route()
	route.AttemptTimeout = short
	o := h.call(context.Background(), route, chat(false), nil)
	if !errors.Is(o.err, exchange.ErrAttemptTimeout) {
		t.Fatalf("err = %v", o.err)
	}
	o.want(t, evidence.Ambiguous)
	if !o.ev.TimedOut {
		t.Fatalf("evidence %+v", o.ev)
	}
}

// A response cut by a GOAWAY carrying debug data: the server answered,
// sent part of the body, then GOAWAY and a close. x/net's body-read error
// prints the debug data; the error an adapter returns must not (docs/contract.md
// section 7), on every path that reads a body, in both dialects. The
// GOAWAY stays reachable with errors.As, as the engine's AttemptError.
func TestGoAwayDebugDataNeverInBodyReadErrors(t *testing.T) {
	const debug = "durallm-providertest" // what every testsuite GOAWAY carries
	for _, tc := range []struct {
		name    string
		h       func(*testing.T) *harness
		route   func(*harness) routes.Route
		stream  bool
		b       providertest.Behavior
		partial bool // the cut comes after content: a partial result, no error
	}{
		{"openai JSON body", newHarness, (*harness).route, false, providertest.BodyCut(200, nil, `{"id":"x","choices":[`, providertest.CutGoAway), false},
		{"openai error body", newHarness, (*harness).route, false, providertest.BodyCut(500, nil, `{"error":{"message":"bo`, providertest.CutGoAway), false},
		{"openai stream before content", newHarness, (*harness).route, true, providertest.StreamCut(0, providertest.CutGoAway), false},
		{"openai stream after content", newHarness, (*harness).route, true, providertest.StreamCut(2, providertest.CutGoAway), true},
		{"anthropic JSON body", newAnthropicHarness, (*harness).claude, false, providertest.BodyCut(200, nil, `{"id":"msg_1","content":[`, providertest.CutGoAway), false},
		{"anthropic stream before content", newAnthropicHarness, (*harness).claude, true, providertest.BodyCut(200, sseHeader, events(evMessageStart), providertest.CutGoAway), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h(t)
			h.manual = true
			h.p.Push(tc.b)
			o := h.call(context.Background(), tc.route(h), chat(tc.stream), &recSink{})
			if tc.partial {
				if o.err != nil || !o.res.Response.Partial || o.res.Response.Incomplete != providers.IncompleteGoAway {
					t.Fatalf("err %v response %+v", o.err, o.res.Response)
				}
				return
			}
			if o.err == nil {
				t.Fatalf("a body cut by a GOAWAY read cleanly: %+v", o.res)
			}
			if strings.Contains(o.err.Error(), debug) {
				t.Fatalf("the error carries the GOAWAY debug data: %v", o.err)
			}
			var ga http2.GoAwayError
			var ae *recovery.AttemptError
			if !errors.As(o.err, &ga) || !errors.As(o.err, &ae) || !strings.Contains(o.err.Error(), "GOAWAY") {
				t.Fatalf("the GOAWAY is not named, or not reachable through the AttemptError: %v", o.err)
			}
			if strings.Contains(h.logText(), debug) {
				t.Fatalf("the attempt event carries the debug data: %s", h.logText())
			}
		})
	}
}

func TestResetBeforeContentIsAnError(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.StreamCut(0, providertest.CutReset))
	o := h.call(context.Background(), h.route(), chat(true), &recSink{})
	if o.err == nil || o.res.Response.Partial {
		t.Fatalf("err %v result %+v", o.err, o.res)
	}
	o.want(t, evidence.Ambiguous)
}

func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString(e)
		b.WriteString("\n\n")
	}
	return b.String()
}

var sseHeader = http.Header{"Content-Type": {"text/event-stream"}}

const (
	roleChunk  = `data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`
	helloChunk = `data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hello"}}]}`
)

func TestKeepAlivesAndRoleChunksDoNotCommit(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Status(200, sseHeader, sse(": keep-alive", ": keep-alive", roleChunk, "data: [DONE]")))
	sink := &recSink{}
	o := h.call(context.Background(), h.route(), chat(true), sink)
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.ev.ContentStarted || len(sink.deltas) != 0 {
		t.Fatalf("keep-alives or a role-only chunk committed: %+v", o.ev)
	}
	o.want(t, evidence.EmptyResponse)
}

// A stream that ends cleanly with no content and no end marker was cut
// before its first content: a proxy turns an origin's reset after the
// headers into exactly this (haproxy does). The provider ran the request,
// so it is ambiguous, not an empty response that may fall back. With the
// end marker, the same stream is an honest empty response (above).
func TestStreamCutBeforeContentIsAmbiguous(t *testing.T) {
	for _, tc := range []struct {
		name  string
		h     func(*testing.T) *harness
		route func(*harness) routes.Route
		body  string
	}{
		{"openai", newHarness, (*harness).route, sse(": keep-alive", roleChunk)},
		{"openai, nothing at all", newHarness, (*harness).route, ""},
		{"anthropic", newAnthropicHarness, (*harness).claude, events(evMessageStart, evPing)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h(t)
			h.p.Push(providertest.Status(200, sseHeader, tc.body))
			sink := &recSink{}
			o := h.call(context.Background(), tc.route(h), chat(true), sink)
			if o.err != nil || o.res.Signal != evidence.SignalStreamIncomplete {
				t.Fatalf("signal %q err %v", o.res.Signal, o.err)
			}
			o.want(t, evidence.Ambiguous)
			if o.ev.ContentStarted || len(sink.deltas) != 0 || len(sink.incomplete) != 0 || o.res.Response.Partial {
				t.Fatalf("a stream with no content committed or reported partial: %+v %+v", o.ev, o.res.Response)
			}
		})
	}
}

// A body cut before content, in the middle of what it was sending and
// then ended cleanly (a proxy's END_STREAM after the origin died): the
// provider accepted and ran the request, so the attempt is ambiguous, not
// an empty response that falls back to a second provider. The same holds
// for an SSE event cut mid-way and for a JSON body cut mid-value, in both
// dialects. CANARY is in every cut: the error must not quote the body.
func TestTruncatedBodyBeforeContentIsAmbiguous(t *testing.T) {
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name   string
		h      func(*testing.T) *harness
		route  func(*harness) routes.Route
		stream bool
		b      providertest.Behavior
	}{
		{"openai event cut mid-line", newHarness, (*harness).route, true,
			providertest.Status(200, sseHeader, sse(": keep-alive", roleChunk)+`data: {"id":"c1","choices":[{"index":0,"delta":{"content":"CANARY`)},
		{"openai event cut after a data line", newHarness, (*harness).route, true,
			providertest.Status(200, sseHeader, sse(roleChunk)+`data: {"id":"c1","choices":[{"index":0,"delta":{"content":"CANARY"}}`+"\n")},
		{"openai [DONE] cut", newHarness, (*harness).route, true,
			providertest.Status(200, sseHeader, sse(roleChunk)+`data: [DO`)},
		{"anthropic event cut", newAnthropicHarness, (*harness).claude, true,
			providertest.Status(200, sseHeader, events(evMessageStart, evPing)+"event: content_block_delta\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"CANARY`)},
		{"openai JSON cut", newHarness, (*harness).route, false,
			providertest.Status(200, jsonHeader, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"CANARY`)},
		{"openai JSON cut between members", newHarness, (*harness).route, false,
			providertest.Status(200, jsonHeader, `{"id":"chatcmpl-CANARY","object":"chat.completion",`)},
		{"anthropic JSON cut", newAnthropicHarness, (*harness).claude, false,
			providertest.Status(200, jsonHeader, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"CANARY`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h(t)
			h.manual = true // as the CallModel activity makes every attempt
			h.p.Push(tc.b)
			sink := &recSink{}
			o := h.call(context.Background(), tc.route(h), chat(tc.stream), sink)
			if o.res.Signal != evidence.SignalStreamIncomplete || !errors.Is(o.err, exchange.ErrTruncatedBody) {
				t.Fatalf("signal %q err %v, want %q and ErrTruncatedBody", o.res.Signal, o.err, evidence.SignalStreamIncomplete)
			}
			if strings.Contains(o.err.Error(), "CANARY") {
				t.Fatalf("the error quotes the body: %v", o.err)
			}
			o.want(t, evidence.Ambiguous)
			if o.ev.ContentStarted || len(sink.deltas) != 0 || len(sink.incomplete) != 0 || o.res.Response.Partial {
				t.Fatalf("a body cut before content committed or reported partial: %+v %+v", o.ev, o.res.Response)
			}
		})
	}
}

// The same cut after content started is a partial answer with the text
// so far, committed_partial once finished as CallModel finishes a Partial
// response; and a final event that is complete without its blank line is
// read as usual, not taken for a cut.
func TestTruncatedBodyAfterContent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       func(*testing.T) *harness
		route   func(*harness) routes.Route
		body    string
		partial bool
		text    string
		class   evidence.Class
	}{
		{"openai event cut", newHarness, (*harness).route,
			sse(roleChunk, helloChunk) + `data: {"id":"c1","choices":[{"index":0,"delta":{"content":" wor`, true, "hello", evidence.CommittedPartial},
		{"anthropic event cut", newAnthropicHarness, (*harness).claude,
			events(evMessageStart, evTextStart, evHello) + "event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_d`, true, "Hello", evidence.CommittedPartial},
		{"openai [DONE] without its blank line", newHarness, (*harness).route,
			sse(helloChunk) + "data: [DONE]", false, "hello", evidence.Completed},
		{"openai final chunk without its blank line", newHarness, (*harness).route,
			sse(helloChunk) + `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, false, "hello", evidence.Completed},
		{"anthropic message_stop without its blank line", newAnthropicHarness, (*harness).claude,
			events(evMessageStart, evTextStart, evHello) + "event: message_stop\ndata: " + evMessageStop, false, "Hello", evidence.Completed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h(t)
			h.p.Push(providertest.Status(200, sseHeader, tc.body))
			sink := &recSink{}
			o := h.call(context.Background(), tc.route(h), chat(true), sink)
			if o.err != nil {
				t.Fatal(o.err)
			}
			r := o.res.Response
			if r.Partial != tc.partial || r.Text != tc.text || sink.text() != tc.text || !o.ev.ContentStarted {
				t.Fatalf("response %+v sink %q evidence %+v", r, sink.deltas, o.ev)
			}
			if tc.partial && (r.Incomplete != providers.IncompleteTruncated || len(sink.incomplete) != 1 || sink.incomplete[0] != providers.IncompleteTruncated) {
				t.Fatalf("incomplete %q, sink %q", r.Incomplete, sink.incomplete)
			}
			// As the CallModel activity finishes: a Partial response is
			// stream_incomplete.
			ev := o.ev
			if r.Partial && o.res.Signal == evidence.SignalNone {
				ev.Signal = evidence.SignalStreamIncomplete
			}
			if c := evidence.Classify(ev); c.Class != tc.class {
				t.Fatalf("classified %s (%s), want %s", c.Class, c.Reason, tc.class)
			}
		})
	}
}

func TestTruncatedStream(t *testing.T) {
	// Content, then a clean end of the body with neither [DONE] nor a
	// finish_reason. The recovery engine saw a clean END_STREAM, so its
	// classification is up to the caller (Response.Partial says it).
	h := newHarness(t)
	h.p.Push(providertest.Status(200, sseHeader, sse(roleChunk, helloChunk)))
	sink := &recSink{}
	o := h.call(context.Background(), h.route(), chat(true), sink)
	if o.err != nil {
		t.Fatal(o.err)
	}
	r := o.res.Response
	if !r.Partial || r.Incomplete != providers.IncompleteTruncated || r.Text != "hello" {
		t.Fatalf("response %+v", r)
	}
	if len(sink.incomplete) != 1 || sink.incomplete[0] != providers.IncompleteTruncated || !o.ev.ContentStarted {
		t.Fatalf("sink incomplete %q evidence %+v", sink.incomplete, o.ev)
	}
}

func TestStreamCompleteWithFinishReasonWithoutDone(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Status(200, sseHeader, sse(helloChunk, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`)))
	o := h.call(context.Background(), h.route(), chat(true), &recSink{})
	if o.err != nil || o.res.Response.Partial || o.res.Response.FinishReason != "length" {
		t.Fatalf("err %v response %+v", o.err, o.res.Response)
	}
	o.want(t, evidence.Completed)
}

func TestStreamErrorEvents(t *testing.T) {
	t.Run("before content", func(t *testing.T) {
		h := newHarness(t)
		h.p.Push(providertest.Status(200, sseHeader, sse(roleChunk, `data: {"error":{"type":"overloaded_error","message":"busy"}}`)))
		o := h.call(context.Background(), h.route(), chat(true), &recSink{})
		if o.err != nil || o.res.Signal != evidence.SignalOverloaded {
			t.Fatalf("err %v signal %q", o.err, o.res.Signal)
		}
		o.want(t, evidence.Throttled)
	})
	t.Run("after content", func(t *testing.T) {
		h := newHarness(t)
		h.p.Push(providertest.Status(200, sseHeader, sse(helloChunk, `event: error`+"\n"+`data: {"type":"server_error","message":"boom"}`, helloChunk)))
		sink := &recSink{}
		o := h.call(context.Background(), h.route(), chat(true), sink)
		if o.err != nil {
			t.Fatal(o.err)
		}
		r := o.res.Response
		if !r.Partial || r.Incomplete != providers.IncompleteProviderError || r.Text != "hello" || r.Error == nil || r.Error.Type != "server_error" {
			t.Fatalf("response %+v", r)
		}
		o.want(t, evidence.CommittedPartial)
	})
}

func TestMalformedStreams(t *testing.T) {
	t.Run("malformed before content", func(t *testing.T) {
		h := newHarness(t)
		h.p.Push(providertest.Status(200, sseHeader, sse(roleChunk, "data: {not json")))
		o := h.call(context.Background(), h.route(), chat(true), &recSink{})
		if !errors.Is(o.err, exchange.ErrMalformedStream) || o.res.Signal != evidence.SignalEmptyResponse {
			t.Fatalf("err %v signal %q", o.err, o.res.Signal)
		}
		o.want(t, evidence.EmptyResponse)
	})
	t.Run("malformed after content", func(t *testing.T) {
		h := newHarness(t)
		h.p.Push(providertest.Status(200, sseHeader, sse(helloChunk, "data: {not json", helloChunk)))
		o := h.call(context.Background(), h.route(), chat(true), &recSink{})
		if o.err != nil || !o.res.Response.Partial || o.res.Response.Incomplete != providers.IncompleteMalformed {
			t.Fatalf("err %v response %+v", o.err, o.res.Response)
		}
		o.want(t, evidence.CommittedPartial)
	})
	t.Run("endless line before content", func(t *testing.T) {
		h := newHarness(t)
		h.p.Push(providertest.Status(200, sseHeader, "data: "+strings.Repeat("x", exchange.MaxSSELineBytes+1024)))
		o := h.call(context.Background(), h.route(), chat(true), &recSink{})
		if !errors.Is(o.err, exchange.ErrLineTooLong) || o.res.Signal != evidence.SignalEmptyResponse {
			t.Fatalf("err %v signal %q", o.err, o.res.Signal)
		}
		o.want(t, evidence.EmptyResponse)
	})
	t.Run("non-JSON 200", func(t *testing.T) {
		h := newHarness(t)
		h.p.Push(providertest.Status(200, http.Header{"Content-Type": {"text/html"}}, "<html>maintenance</html>"))
		o := h.call(context.Background(), h.route(), chat(false), nil)
		if !errors.Is(o.err, exchange.ErrMalformedResponse) || o.res.Signal != evidence.SignalEmptyResponse {
			t.Fatalf("err %v signal %q", o.err, o.res.Signal)
		}
		o.want(t, evidence.EmptyResponse)
	})
}

func TestProviderIgnoringStreamFlag(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Status(200, nil, `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"whole answer"},"finish_reason":"stop"}]}`))
	sink := &recSink{}
	o := h.call(context.Background(), h.route(), chat(true), sink)
	if o.err != nil || o.res.Response.Text != "whole answer" || sink.text() != "whole answer" {
		t.Fatalf("err %v response %+v sink %q", o.err, o.res.Response, sink.deltas)
	}
	o.want(t, evidence.Completed)
}

func TestCallerCancelAfterCommit(t *testing.T) {
	stop := errors.New("activity canceled by the workflow")
	for _, tc := range []struct {
		name  string
		cause error // nil: a plain cancel
	}{{"plain", nil}, {"with a cause", stop}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.p.Push(providertest.StreamStall(1))
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			sink := &recSink{onDelta: func() { cancel(tc.cause) }}
			o := h.call(ctx, h.route(), chat(true), sink)
			want := tc.cause
			if want == nil {
				want = context.Canceled
			}
			if !errors.Is(o.err, want) {
				t.Fatalf("err = %v, want %v", o.err, want)
			}
			r := o.res.Response
			if !r.Partial || r.Incomplete != providers.IncompleteCanceled || r.Text != "chunk1" {
				t.Fatalf("response %+v", r)
			}
			if len(sink.incomplete) != 1 || sink.incomplete[0] != providers.IncompleteCanceled {
				t.Fatalf("sink incomplete %q", sink.incomplete)
			}
			o.want(t, evidence.Canceled)
		})
	}
}

func TestCallerCancelBeforeContent(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Hold())
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for h.p.ExecutedCount("key-"+t.Name()) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	o := h.call(ctx, h.route(), chat(true), &recSink{})
	if !errors.Is(o.err, context.Canceled) || o.res.Response.Partial {
		t.Fatalf("err %v result %+v", o.err, o.res)
	}
	o.want(t, evidence.Canceled)
}

// A plain RoundTripper and no attempt in the context: the adapter works
// (commit is skipped) and sends exactly one request with a rewindable body.
func TestPlainRoundTripperWithoutAttempt(t *testing.T) {
	var sent *http.Request
	var body []byte
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if sent != nil {
			t.Fatal("sent twice")
		}
		sent = r
		body, _ = io.ReadAll(r.Body)
		return &http.Response{StatusCode: 200, Header: sseHeader,
			Body: io.NopCloser(strings.NewReader(sse(roleChunk, helloChunk, "data: [DONE]")))}, nil
	})
	route := routes.Route{Name: "plain", Kind: "openai", BaseURL: "http://127.0.0.1:1/v1/", Model: "m"}
	sink := &recSink{}
	res, err := exchange.CallOpenAI(context.Background(), rt, exchange.Call{Route: route, Request: chat(true), Sink: sink})
	if err != nil || res.Response.Text != "hello" || sink.text() != "hello" {
		t.Fatalf("err %v result %+v", err, res)
	}
	if sent.URL.String() != "http://127.0.0.1:1/v1/chat/completions" || sent.GetBody == nil || sent.Header.Get("Accept") != "text/event-stream" {
		t.Fatalf("request %s %v", sent.URL, sent.Header)
	}
	if !json.Valid(body) {
		t.Fatalf("body %s", body)
	}
	if _, err := exchange.CallOpenAI(context.Background(), nil, exchange.Call{Route: route, Request: chat(false)}); !errors.Is(err, exchange.ErrNoTransport) {
		t.Fatalf("nil transport: %v", err)
	}
	if _, err := exchange.CallOpenAI(context.Background(), rt, exchange.Call{Route: route}); !errors.Is(err, providers.ErrInvalidRequest) {
		t.Fatalf("invalid request: %v", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// No prompt, output or key reaches an error string (docs/contract.md section
// 7), nor the engine's attempt events, whatever way the attempt fails.
func TestNoContentOrKeyInErrors(t *testing.T) {
	const (
		promptCanary = "CANARY-PROMPT-4e1b9c"
		outputCanary = "CANARY-OUTPUT-77a0d2"
		keyCanary    = "sk-CANARY-KEY-c0ffee"
	)
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(keyCanary), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	withKey := h.route()
	withKey.APIKeyFile = keyFile
	req := func(stream bool) providers.Request {
		return providers.Request{Messages: []providers.Message{
			providers.TextMessage("system", "secret system "+promptCanary),
			providers.TextMessage("user", promptCanary),
		}, Stream: stream}
	}
	echo := `{"error":{"message":"Invalid prompt: ` + promptCanary + ` ... ` + keyCanary + `","type":"invalid_request_error","code":"` + outputCanary + `"}}`

	got := capture(h.p, providertest.Answer(outputCanary+" and more"))
	if o := h.call(context.Background(), withKey, req(true), &recSink{}); o.err != nil || !strings.Contains(o.res.Response.Text, outputCanary) {
		t.Fatalf("the canaries must actually flow: %v %+v", o.err, o.res.Response)
	}
	if a := got().Header.Get("Authorization"); a != "Bearer "+keyCanary {
		t.Fatalf("key not sent: %q", a)
	}
	h.p.Script(nil)

	type scenario struct {
		name  string
		b     *providertest.Behavior // nil: the request never reaches the provider
		route func(*routes.Route)
		req   providers.Request
		noErr bool // the scenario ends without a Go error; its result is checked instead
	}
	scenarios := []scenario{
		{name: "first-byte timeout", b: ptr(providertest.Hold()), route: func(r *routes.Route) { r.FirstByteTimeout = short }, req: req(true)},
		{name: "attempt timeout", b: ptr(providertest.Hold()), route: func(r *routes.Route) { r.AttemptTimeout = short }, req: req(false)},
		{name: "reset before headers", b: ptr(providertest.ResetStream(http2.ErrCodeInternal)), req: req(false)},
		{name: "connection closed", b: ptr(providertest.CloseAfterRead()), req: req(true)},
		{name: "malformed body", b: ptr(providertest.Status(200, nil, `{"choices":[{"message":{"content":"`+outputCanary)), req: req(false)},
		{name: "malformed stream", b: ptr(providertest.Status(200, sseHeader, sse(roleChunk, "data: {"+outputCanary))), req: req(true)},
		{name: "endless line", b: ptr(providertest.Status(200, sseHeader, "data: "+strings.Repeat(outputCanary, exchange.MaxSSELineBytes/len(outputCanary)+10))), req: req(true)},
		{name: "error body echoing the prompt", b: ptr(providertest.Status(400, nil, echo)), req: req(false), noErr: true},
		{name: "error event echoing the prompt", b: ptr(providertest.Status(200, sseHeader, sse(`data: `+echo))), req: req(true), noErr: true},
		{name: "attempt timeout while streaming", b: ptr(providertest.Hold()), route: func(r *routes.Route) { r.AttemptTimeout = short }, req: req(true)},
		{name: "invalid request", req: providers.Request{Messages: []providers.Message{{Role: "", Content: json.RawMessage(promptCanary)}}}},
		{name: "key env holds a pasted key", route: func(r *routes.Route) { r.APIKeyFile, r.APIKeyEnv = "", keyCanary }, req: req(false)},
		{name: "unreachable", route: func(r *routes.Route) { r.BaseURL = "https://" + closedAddr(t) + "/v1" }, req: req(false)},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			if sc.b != nil {
				h.p.Push(*sc.b)
			}
			route := withKey
			if sc.route != nil {
				sc.route(&route)
			}
			o := h.call(context.Background(), route, sc.req, &recSink{})
			if sc.noErr {
				if o.err != nil {
					t.Fatalf("unexpected error %v", o.err)
				}
				return
			}
			if o.err == nil {
				t.Fatalf("no error (result %+v)", o.res)
			}
			for _, c := range []string{promptCanary, outputCanary, keyCanary} {
				if strings.Contains(o.err.Error(), c) {
					t.Fatalf("error contains %s: %v", c, o.err)
				}
			}
		})
	}
	for _, c := range []string{promptCanary, outputCanary, keyCanary} {
		if strings.Contains(h.logText(), c) {
			t.Fatalf("the attempt log contains %s", c)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// pipeTransport answers every request with 200 text/event-stream and a body
// the test writes through w.
func pipeTransport() (http.RoundTripper, *io.PipeWriter) {
	pr, pw := io.Pipe()
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		go func() {
			// The request context ending must end the body, as a real
			// transport's does.
			<-r.Context().Done()
			pr.CloseWithError(context.Cause(r.Context()))
		}()
		return &http.Response{StatusCode: 200, Header: sseHeader, Body: pr}, nil
	}), pw
}

// The wait for the first byte does not count toward the idle timeout, and
// keep-alive comments restart the idle timer. The margins are wide (each
// gap is a small fraction of the timer it must not trip), and nothing is
// asserted about durations.
func TestTimersFirstByteAndKeepAlives(t *testing.T) {
	rt, w := pipeTransport()
	route := routes.Route{Name: "pipe", Kind: "openai", BaseURL: "http://127.0.0.1:1/v1", Model: "m",
		FirstByteTimeout: 5 * time.Second, IdleTimeout: 300 * time.Millisecond}
	go func() {
		time.Sleep(400 * time.Millisecond) // longer than idle, shorter than first-byte
		for range 25 {                     // 500ms of keep-alives: longer than idle in total
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		_, _ = io.WriteString(w, sse(helloChunk, "data: [DONE]"))
		_ = w.Close()
	}()
	sink := &recSink{}
	res, err := exchange.CallOpenAI(context.Background(), rt, exchange.Call{Route: route, Request: chat(true), Sink: sink})
	if err != nil || res.Response.Text != "hello" || res.Response.Partial {
		t.Fatalf("err %v result %+v", err, res)
	}
}

// The idle timer fires on silence after keep-alives: keep-alives are bytes,
// not content, so the stream ends before commit with an error.
func TestIdleTimeoutBeforeContentIsAnError(t *testing.T) {
	rt, w := pipeTransport()
	route := routes.Route{Name: "pipe", Kind: "openai", BaseURL: "http://127.0.0.1:1/v1", Model: "m", IdleTimeout: short}
	go func() { _, _ = io.WriteString(w, ": keep-alive\n\n"+roleChunk+"\n\n") }()
	res, err := exchange.CallOpenAI(context.Background(), rt, exchange.Call{Route: route, Request: chat(true), Sink: &recSink{}})
	if !errors.Is(err, exchange.ErrIdleTimeout) || res.Response.Partial {
		t.Fatalf("err %v result %+v", err, res)
	}
}

func TestWrongKindIsRefusedBeforeSending(t *testing.T) {
	rt := roundTripFunc(func(*http.Request) (*http.Response, error) {
		t.Fatal("sent")
		return nil, nil
	})
	route := routes.Route{Name: "a", Kind: "anthropic", BaseURL: "https://x.example/v1", Model: "m"}
	if _, err := exchange.CallOpenAI(context.Background(), rt, exchange.Call{Route: route, Request: chat(false)}); !errors.Is(err, exchange.ErrWrongKind) {
		t.Fatalf("err %v", err)
	}
}
