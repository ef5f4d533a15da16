package providertest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

type completionJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func TestAnswerNonStreamTLS(t *testing.T) {
	p := newTestProvider(t, WithModel("model-x"))
	tr := tlsTransport(t, p)
	p.Push(Answer("hello from the provider"))

	resp, body, err := roundTrip(tr, chatReq(t, testCtx(t), p.URL(), false, "key-1", "att-1"))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("status %d proto %d, want 200 over HTTP/2", resp.StatusCode, resp.ProtoMajor)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("content-type %q", ct)
	}
	var cc completionJSON
	if err := json.Unmarshal(body, &cc); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if cc.Object != "chat.completion" || cc.Model != "model-x" || cc.ID == "" || cc.Created == 0 {
		t.Errorf("completion header fields wrong: %+v", cc)
	}
	if len(cc.Choices) != 1 || cc.Choices[0].Message.Role != "assistant" ||
		cc.Choices[0].Message.Content != "hello from the provider" || cc.Choices[0].FinishReason != "stop" {
		t.Errorf("choices wrong: %+v", cc.Choices)
	}
	if cc.Usage == nil || cc.Usage.CompletionTokens != 4 || cc.Usage.TotalTokens != cc.Usage.PromptTokens+4 {
		t.Errorf("usage wrong: %+v", cc.Usage)
	}

	want := Record{ConnIndex: 0, StreamID: 1, Proto: ProtoHTTP2, Path: "/v1/chat/completions", IdempotencyKey: "key-1",
		AttemptID: "att-1", Model: "gpt-test", Stream: false, Behavior: "Answer"}
	if got := p.Received(); len(got) != 1 || got[0] != want {
		t.Errorf("Received = %+v, want [%+v]", got, want)
	}
	if got := p.Processed(); len(got) != 1 || got[0] != want {
		t.Errorf("Processed = %+v, want [%+v]", got, want)
	}
	if p.ExecutedCount("key-1") != 1 || p.AttemptExecutions("att-1") != 1 || p.ConnsAccepted() != 1 {
		t.Errorf("counts: executed %d attempts %d conns %d", p.ExecutedCount("key-1"), p.AttemptExecutions("att-1"), p.ConnsAccepted())
	}
}

func TestAnswerStreamH2C(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	const text = "one  two three\tfour"
	p.SetDefault(Answer(text))

	resp, err := tr.RoundTrip(chatReq(t, testCtx(t), p.H2CURL(), true, "", "att-s"))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sr := sseReader{bufio.NewReader(resp.Body)}
	var content strings.Builder
	var contentChunks int
	var id string
	for {
		data, err := sr.next()
		if err != nil {
			t.Fatalf("stream ended before [DONE]: %v", err)
		}
		if data == "[DONE]" {
			break
		}
		c := decodeChunk(t, data)
		if c.Object != "chat.completion.chunk" || c.Model != "durallm-test" || len(c.Choices) != 1 {
			t.Fatalf("bad chunk %q", data)
		}
		if id == "" {
			id = c.ID
		} else if c.ID != id {
			t.Errorf("chunk id changed: %q then %q", id, c.ID)
		}
		if fr := c.Choices[0].FinishReason; fr != nil {
			if *fr != "stop" || c.Usage == nil || c.Usage.CompletionTokens != 4 {
				t.Errorf("final chunk wrong: %q", data)
			}
			continue
		}
		if contentChunks == 0 && c.Choices[0].Delta.Role != "assistant" {
			t.Errorf("first chunk has no assistant role: %q", data)
		}
		contentChunks++
		content.WriteString(c.Choices[0].Delta.Content)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Errorf("after [DONE]: %v", err)
	}
	if content.String() != text || contentChunks != 4 {
		t.Errorf("content %q in %d chunks, want %q in 4", content.String(), contentChunks, text)
	}
	if got := p.Processed(); len(got) != 1 || !got[0].Stream || got[0].AttemptID != "att-s" {
		t.Errorf("Processed = %+v", got)
	}
}

func TestZeroBehaviorAnswersOK(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	p.Push(Behavior{})
	_, body, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "z"))
	if err != nil {
		t.Fatal(err)
	}
	var cc completionJSON
	if err := json.Unmarshal(body, &cc); err != nil || cc.Choices[0].Message.Content != "ok" {
		t.Fatalf("body %q err %v", body, err)
	}
	if got := p.Processed(); len(got) != 1 || got[0].Behavior != "Answer" {
		t.Errorf("Processed = %+v", got)
	}
}

// TestGoAwayAboveHiddenReplay shows the hidden replay the project exists
// to catch: the bare transport re-sends a request refused by GOAWAY on a
// new connection, and only the provider's records reveal the two sends.
func TestGoAwayAboveHiddenReplay(t *testing.T) {
	p := newTestProvider(t)
	tr := tlsTransport(t, p)
	p.Push(GoAwayAbove(http2.ErrCodeNo), Answer("second time lucky"))

	resp, body, err := roundTrip(tr, chatReq(t, testCtx(t), p.URL(), false, "idem", "att-replay"))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	if resp.StatusCode != 200 || !strings.Contains(string(body), "second time lucky") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	var sends []Record
	for _, r := range p.Received() {
		if r.AttemptID == "att-replay" {
			sends = append(sends, r)
		}
	}
	if len(sends) != 2 {
		t.Fatalf("provider saw attempt on %d streams, want 2: %+v", len(sends), p.Received())
	}
	if sends[0].Behavior != "GoAwayAbove(NO_ERROR)" || sends[1].Behavior != "Answer" || sends[0].ConnIndex == sends[1].ConnIndex {
		t.Errorf("sends = %+v; want GOAWAY on one connection, answer on another", sends)
	}
	if n := p.AttemptExecutions("att-replay"); n != 1 {
		t.Errorf("AttemptExecutions = %d, want 1 (the refused send never executed)", n)
	}
	if n := p.ConnsAccepted(); n != 2 {
		t.Errorf("ConnsAccepted = %d, want 2", n)
	}
}

func TestGoAwayAboveErrorCodeFailsRequest(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	p.Push(GoAwayAbove(http2.ErrCodeProtocol))

	_, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "att-ga"))
	if err == nil || !strings.Contains(err.Error(), "GOAWAY") {
		t.Fatalf("err = %v, want a GOAWAY error", err)
	}
	if n := len(p.Processed()); n != 0 {
		t.Errorf("Processed has %d records, want 0", n)
	}
	waitFor(t, "connection closed", func() bool { return p.ConnsOpen() == 0 })
}

func TestGoAwayAfterProcessing(t *testing.T) {
	p := newTestProvider(t)
	tr := tlsTransport(t, p)
	p.Push(GoAwayAfterProcessing(http2.ErrCodeNo))

	_, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.URL(), false, "idem-gap", "att-gap"))
	if err == nil || !strings.Contains(err.Error(), "GOAWAY") {
		t.Fatalf("err = %v, want GOAWAY-and-close error", err)
	}
	if n := p.ExecutedCount("idem-gap"); n != 1 {
		t.Errorf("ExecutedCount = %d, want 1", n)
	}
	if n := len(p.Received()); n != 1 {
		t.Errorf("Received %d, want 1 (no replay of a maybe-processed stream)", n)
	}
}

func TestRefuseStream(t *testing.T) {
	t.Run("replayed with GetBody", func(t *testing.T) {
		p := newTestProvider(t)
		tr := h2cTransport(t)
		p.Push(RefuseStream())
		resp, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "att-ref"))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("RoundTrip: %v", err)
		}
		got := p.Received()
		if len(got) != 2 || got[0].Behavior != "RefuseStream" || got[0].ConnIndex != got[1].ConnIndex {
			t.Errorf("Received = %+v, want refuse then answer on one connection", got)
		}
		if n := p.AttemptExecutions("att-ref"); n != 1 {
			t.Errorf("AttemptExecutions = %d, want 1", n)
		}
	})
	t.Run("error without GetBody", func(t *testing.T) {
		p := newTestProvider(t)
		tr := h2cTransport(t)
		p.Push(RefuseStream())
		req := chatReq(t, testCtx(t), p.H2CURL(), false, "", "att-ref2")
		req.GetBody = nil
		_, _, err := roundTrip(tr, req)
		if err == nil || !strings.Contains(err.Error(), "REFUSED_STREAM") {
			t.Fatalf("err = %v, want REFUSED_STREAM", err)
		}
		if len(p.Received()) != 1 || len(p.Processed()) != 0 {
			t.Errorf("Received %+v Processed %+v", p.Received(), p.Processed())
		}
	})
}

func TestResetStream(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	p.Push(ResetStream(http2.ErrCodeInternal))
	_, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "att-rst"))
	var se http2.StreamError
	if !errors.As(err, &se) || se.Code != http2.ErrCodeInternal {
		t.Fatalf("err = %v, want stream error INTERNAL_ERROR", err)
	}
	if n := p.AttemptExecutions("att-rst"); n != 1 || len(p.Received()) != 1 {
		t.Errorf("executions %d received %d, want 1 and 1", n, len(p.Received()))
	}
}

func TestCloseAfterRead(t *testing.T) {
	p := newTestProvider(t)
	tr := tlsTransport(t, p)
	p.Push(CloseAfterRead())
	_, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.URL(), false, "", "att-car"))
	if err == nil {
		t.Fatal("RoundTrip succeeded, want connection error")
	}
	if strings.Contains(err.Error(), "GOAWAY") {
		t.Errorf("err = %v; CloseAfterRead must not send GOAWAY", err)
	}
	if n := p.AttemptExecutions("att-car"); n != 1 || len(p.Received()) != 1 {
		t.Errorf("executions %d received %d, want 1 and 1", n, len(p.Received()))
	}
	waitFor(t, "connection closed", func() bool { return p.ConnsOpen() == 0 })
}

func TestStatusForms(t *testing.T) {
	date := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name       string
		b          Behavior
		status     int
		header     string
		value      string
		executed   bool
		errorType  string
		rawBodyNot bool // body is not an OpenAI error object
	}{
		{"misdirected", Misdirected(), 421, "", "", false, "invalid_request_error", false},
		{"429 seconds", TooManyRequests(RetryAfterSeconds(7)), 429, "Retry-After", "7", false, "requests", false},
		{"429 ms", TooManyRequests(RetryAfterMS(1500)), 429, "Retry-After-Ms", "1500", false, "requests", false},
		{"429 garbage", TooManyRequests(RetryAfterRaw("soon-ish")), 429, "Retry-After", "soon-ish", false, "requests", false},
		{"503 date", Unavailable(RetryAfterDate(date)), 503, "Retry-After", "Wed, 02 Jan 2030 03:04:05 GMT", false, "server_error", false},
		{"503 none", Unavailable(nil), 503, "", "", false, "server_error", false},
		{"500", ServerError(500), 500, "", "", true, "server_error", false},
		{"502", ServerError(502), 502, "", "", true, "server_error", false},
		{"504", ServerError(504), 504, "", "", true, "server_error", false},
		{"529", Status(529, nil, `{"error":{"message":"overloaded","type":"overloaded_error"}}`), 529, "", "", false, "overloaded_error", false},
		{"400", Status(400, http.Header{"X-Why": {"bad"}}, `{"error":{"message":"bad","type":"invalid_request_error"}}`), 400, "X-Why", "bad", false, "invalid_request_error", false},
		{"500 overridden", ServerError(500).Processed(false), 500, "", "", false, "server_error", false},
		{"custom type", Status(200, http.Header{"Content-Type": {"text/plain"}, "Connection": {"close"}}, "plain"), 200, "Content-Type", "text/plain", true, "", true},
	}
	p := newTestProvider(t)
	tr := h2cTransport(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p.Reset()
			p.Push(tc.b)
			resp, body, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "att"))
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.header != "" && resp.Header.Get(tc.header) != tc.value {
				t.Errorf("%s = %q, want %q", tc.header, resp.Header.Get(tc.header), tc.value)
			}
			if resp.Header.Get("Connection") != "" {
				t.Error("connection-specific header was sent")
			}
			if !tc.rawBodyNot {
				var e struct {
					Error struct {
						Message string `json:"message"`
						Type    string `json:"type"`
					} `json:"error"`
				}
				if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type != tc.errorType {
					t.Errorf("error body %q (%v), want type %q", body, err, tc.errorType)
				}
				if resp.Header.Get("Content-Type") != "application/json" {
					t.Errorf("content-type %q", resp.Header.Get("Content-Type"))
				}
			}
			if got := p.AttemptExecutions("att"); got != b2i(tc.executed) {
				t.Errorf("executions %d, want %v", got, tc.executed)
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestEmptyBodyAndNoChoices(t *testing.T) {
	p := newTestProvider(t)
	tr := tlsTransport(t, p)

	p.Push(EmptyBody())
	resp, body, err := roundTrip(tr, chatReq(t, testCtx(t), p.URL(), false, "", "att-empty"))
	if err != nil || resp.StatusCode != 200 || len(body) != 0 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("EmptyBody: err %v status %v body %q", err, resp, body)
	}

	p.Push(NoChoices())
	resp, body, err = roundTrip(tr, chatReq(t, testCtx(t), p.URL(), false, "", "att-none"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("NoChoices: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || string(raw["choices"]) != "[]" || string(raw["object"]) != `"chat.completion"` {
		t.Errorf("NoChoices body %q (%v)", body, err)
	}
	if p.AttemptExecutions("att-empty") != 1 || p.AttemptExecutions("att-none") != 1 {
		t.Errorf("Processed = %+v", p.Processed())
	}
}

func TestStreamStall(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	p.Push(StreamStall(3))

	ctx, cancel := context.WithCancel(testCtx(t))
	resp, err := tr.RoundTrip(chatReq(t, ctx, p.H2CURL(), true, "", "att-stall"))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	defer resp.Body.Close()
	sr := sseReader{bufio.NewReader(resp.Body)}
	var parts []string
	for range 3 {
		data, err := sr.next()
		if err != nil {
			t.Fatalf("reading chunk: %v", err)
		}
		parts = append(parts, decodeChunk(t, data).Choices[0].Delta.Content)
	}
	if got := strings.Join(parts, ""); got != "chunk1 chunk2 chunk3" {
		t.Errorf("partial text %q", got)
	}
	if p.StreamsOpen() != 1 {
		t.Errorf("StreamsOpen = %d while stalled, want 1", p.StreamsOpen())
	}
	// The client gives up: its RST_STREAM must end the provider's stream.
	cancel()
	if _, err := sr.next(); err == nil {
		t.Error("read after cancel succeeded")
	}
	waitFor(t, "stalled stream to end after client reset", func() bool { return p.StreamsOpen() == 0 })
	if p.AttemptExecutions("att-stall") != 1 {
		t.Errorf("Processed = %+v", p.Processed())
	}
	// The connection itself is still good.
	if _, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "after")); err != nil {
		t.Errorf("request after stall: %v", err)
	}
	if p.ConnsAccepted() != 1 {
		t.Errorf("ConnsAccepted = %d, want 1", p.ConnsAccepted())
	}
}

func TestStreamCut(t *testing.T) {
	for _, mode := range []CutMode{CutReset, CutClose, CutGoAway} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newTestProvider(t)
			tr := tlsTransport(t, p)
			p.Push(StreamCut(2, mode))
			resp, err := tr.RoundTrip(chatReq(t, testCtx(t), p.URL(), false, "", "att-cut"))
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			defer resp.Body.Close()
			if resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Errorf("content-type %q", resp.Header.Get("Content-Type"))
			}
			sr := sseReader{bufio.NewReader(resp.Body)}
			for i := range 2 {
				if _, err := sr.next(); err != nil {
					t.Fatalf("chunk %d: %v", i, err)
				}
			}
			_, err = sr.next()
			if err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("after the cut: err = %v, want a non-EOF error", err)
			}
			var se http2.StreamError
			isReset := errors.As(err, &se) && se.Code == http2.ErrCodeInternal
			if isReset != (mode == CutReset) {
				t.Errorf("mode %v: err = %v", mode, err)
			}
			checkCutGoAway(t, mode, err)
			if mode == CutClose || mode == CutGoAway {
				waitFor(t, "connection closed", func() bool { return p.ConnsOpen() == 0 })
			} else if p.ConnsOpen() != 1 {
				t.Errorf("CutReset closed the connection")
			}
			if p.AttemptExecutions("att-cut") != 1 {
				t.Errorf("Processed = %+v", p.Processed())
			}
		})
	}
}

// checkCutGoAway: after CutGoAway the body read fails with the GOAWAY,
// debug data and all, and its last-stream-id is the cut stream's (odd,
// so at least 1).
func checkCutGoAway(t *testing.T, mode CutMode, err error) {
	t.Helper()
	var ga http2.GoAwayError
	isGoAway := errors.As(err, &ga)
	if isGoAway != (mode == CutGoAway) {
		t.Errorf("mode %v: err = %v", mode, err)
	}
	if isGoAway && (ga.ErrCode != http2.ErrCodeNo || ga.DebugData != goAwayDebug || ga.LastStreamID%2 != 1) {
		t.Errorf("GOAWAY %+v, want NO_ERROR, debug %q, an odd last stream", ga, goAwayDebug)
	}
}

func TestBodyCut(t *testing.T) {
	for _, mode := range []CutMode{CutReset, CutClose, CutGoAway} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newTestProvider(t)
			tr := tlsTransport(t, p)
			const prefix = `{"id":"x","choices":[`
			p.Push(BodyCut(200, nil, prefix, mode))
			resp, err := tr.RoundTrip(chatReq(t, testCtx(t), p.URL(), false, "", "att-bodycut"))
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.ContentLength != -1 {
				t.Errorf("status %d content-type %q length %d", resp.StatusCode, resp.Header.Get("Content-Type"), resp.ContentLength)
			}
			body, err := io.ReadAll(resp.Body)
			if string(body) != prefix {
				t.Errorf("body %q, want %q", body, prefix)
			}
			if err == nil {
				t.Fatal("the cut body ended cleanly")
			}
			var se http2.StreamError
			isReset := errors.As(err, &se) && se.Code == http2.ErrCodeInternal
			if isReset != (mode == CutReset) {
				t.Errorf("mode %v: err = %v", mode, err)
			}
			checkCutGoAway(t, mode, err)
			if p.AttemptExecutions("att-bodycut") != 1 {
				t.Errorf("Processed = %+v", p.Processed())
			}
		})
	}
	// Status's rule decides execution.
	if BodyCut(429, nil, "{", CutReset).executed() || !BodyCut(502, nil, "{", CutReset).executed() {
		t.Error("BodyCut does not follow Status's execution rule")
	}
	if got := BodyCut(200, nil, "", CutGoAway).String(); got != "BodyCut(200,goaway)" {
		t.Errorf("name %q", got)
	}
}

func TestHoldAndAfterInterruptedByClientReset(t *testing.T) {
	for name, b := range map[string]Behavior{
		"Hold":  Hold(),
		"After": Answer("late").After(time.Hour),
		"Wait":  Answer("late").WaitFor(make(chan struct{})),
	} {
		t.Run(name, func(t *testing.T) {
			p := newTestProvider(t)
			tr := h2cTransport(t)
			p.Push(b)
			ctx, cancel := context.WithCancel(testCtx(t))
			errc := make(chan error, 1)
			go func() {
				_, _, err := roundTrip(tr, chatReq(t, ctx, p.H2CURL(), false, "", "att-hold"))
				errc <- err
			}()
			waitFor(t, "request executing", func() bool { return p.AttemptExecutions("att-hold") == 1 })
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
			waitFor(t, "held stream to end", func() bool { return p.StreamsOpen() == 0 })
		})
	}
}

func TestScriptQueueDefaultAndReset(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	var mu sync.Mutex
	var seen []Request
	p.Script(func(r Request) (Behavior, bool) {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
		if r.AttemptID == "scripted" {
			return ServerError(502), true
		}
		return Behavior{}, false
	})
	p.Push(Answer("queued-1"), Answer("queued-2"))
	p.SetDefault(Answer("default"))

	get := func(attempt string) (int, string) {
		t.Helper()
		resp, body, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", attempt))
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		return resp.StatusCode, string(body)
	}
	if code, _ := get("scripted"); code != 502 {
		t.Errorf("scripted: %d", code)
	}
	for _, want := range []string{"queued-1", "queued-2", "default"} {
		if _, body := get("plain"); !strings.Contains(body, want) {
			t.Errorf("body %q, want %q", body, want)
		}
	}
	mu.Lock()
	r := seen[0]
	mu.Unlock()
	if r.Method != "POST" || r.Path != "/v1/chat/completions" || r.Model != "gpt-test" || r.Stream ||
		!strings.Contains(string(r.Body), `"messages"`) || r.Header.Get("Authorization") != "Bearer test-key" || r.StreamID != 1 {
		t.Errorf("script saw %+v", r)
	}
	behaviors := []string{}
	for _, rec := range p.Received() {
		behaviors = append(behaviors, rec.Behavior)
	}
	if want := []string{"Status(502)", "Answer", "Answer", "Answer"}; !slices.Equal(behaviors, want) {
		t.Errorf("behaviors %v, want %v", behaviors, want)
	}

	p.Push(Answer("stale"))
	p.Reset()
	if len(p.Received()) != 0 || len(p.Processed()) != 0 {
		t.Error("Reset kept records")
	}
	if code, body := get("scripted"); code != 200 || !strings.Contains(body, "default") {
		t.Errorf("after Reset: %d %q; script and queue must be gone, default kept", code, body)
	}
	if p.ConnsAccepted() != 1 {
		t.Errorf("ConnsAccepted = %d after Reset, want 1", p.ConnsAccepted())
	}
}

func TestNonJSONAndLargeBody(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	sizes := make(chan int, 2)
	p.Script(func(r Request) (Behavior, bool) {
		sizes <- len(r.Body)
		return Behavior{}, false
	})

	// 3 MiB is far beyond the 64 KiB initial windows: it only arrives if
	// the provider keeps returning flow-control credit.
	big := strings.Repeat("x", 3<<20)
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, p.H2CURL()+"/anything?q=1", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	resp, _, err := roundTrip(tr, req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("large non-JSON body: %v", err)
	}
	if n := <-sizes; n != len(big) {
		t.Errorf("provider read %d bytes, want %d", n, len(big))
	}
	rec := p.Received()[0]
	if rec.Path != "/anything?q=1" || rec.Model != "" || rec.Stream {
		t.Errorf("record %+v", rec)
	}
}

func TestLargeResponseHeadersUseContinuation(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	big := strings.Repeat("v", 40000)
	p.Push(Status(200, http.Header{"X-Big": {big}}, "{}"))
	resp, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "big"))
	if err != nil || resp.Header.Get("X-Big") != big {
		t.Fatalf("err %v, header intact %v", err, err == nil && resp.Header.Get("X-Big") == big)
	}
	// The HPACK tables must still agree afterwards.
	resp, _, err = roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "after"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("request after big headers: %v", err)
	}
}

func TestOptionsAndTLS(t *testing.T) {
	if _, err := NewProvider(WithMaxConcurrentStreams(0)); err == nil {
		t.Error("WithMaxConcurrentStreams(0) accepted")
	}
	if _, err := NewProvider(WithModel("")); err == nil {
		t.Error(`WithModel("") accepted`)
	}
	p := newTestProvider(t)
	if !strings.HasPrefix(p.URL(), "https://127.0.0.1:") || !strings.HasPrefix(p.H2CURL(), "http://127.0.0.1:") {
		t.Errorf("URL %q H2CURL %q", p.URL(), p.H2CURL())
	}
	cfg := p.ClientTLSConfig()
	if cfg.ServerName != "127.0.0.1" || !slices.Equal(cfg.NextProtos, []string{"h2"}) || cfg.RootCAs == nil {
		t.Errorf("ClientTLSConfig = %+v", cfg)
	}
	// The certificate is also valid for "localhost".
	cfg.ServerName = "localhost"
	tr := &http2.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	resp, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.URL(), false, "", ""))
	if err != nil || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
		t.Fatalf("TLS as localhost: %v", err)
	}
	// An HTTP/1.1-only TLS client is turned away at ALPN.
	h1 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.CertPool(), NextProtos: []string{"http/1.1"}}}
	defer h1.CloseIdleConnections()
	if _, _, err := roundTrip(h1, chatReq(t, testCtx(t), p.URL(), false, "", "")); err == nil {
		t.Error("HTTP/1.1 over TLS succeeded")
	}
	// An HTTP/1.1 request on the h2c port gets the connection closed.
	if _, _, err := roundTrip(&http.Transport{}, chatReq(t, testCtx(t), p.H2CURL(), false, "", "")); err == nil {
		t.Error("HTTP/1.1 on the h2c port succeeded")
	}
}

// AnswerThenKeepOpen: the whole answer and [DONE], then keep-alive
// comments and no end of body, over HTTP/2 and HTTP/1.1, until the client
// goes.
func TestAnswerThenKeepOpen(t *testing.T) {
	p := newTestProvider(t)
	for _, tc := range []struct {
		name string
		tr   http.RoundTripper
		url  string
		open func() int
	}{
		{"h2c", h2cTransport(t), p.H2CURL(), p.StreamsOpen},
		{"http1", &http.Transport{}, p.HTTP1URL(), p.HTTP1ConnsOpen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.Push(AnswerThenKeepOpen("two words"))
			ctx, cancel := context.WithCancel(testCtx(t))
			resp, err := tc.tr.RoundTrip(chatReq(t, ctx, tc.url, true, "", "att-open-"+tc.name))
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			sr := sseReader{br}
			for {
				data, err := sr.next()
				if err != nil {
					t.Fatalf("reading the answer: %v", err)
				}
				if data == "[DONE]" {
					break
				}
			}
			// After [DONE]: the blank line, then a comment, and the body goes on.
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("the body ended after [DONE]: %v", err)
				}
				if line == ": keep-alive\n" {
					break
				}
			}
			if tc.open() != 1 {
				t.Errorf("open = %d while kept open, want 1", tc.open())
			}
			cancel()
			waitFor(t, "the kept-open body to end after the client left", func() bool { return tc.open() == 0 })
			if p.AttemptExecutions("att-open-"+tc.name) != 1 {
				t.Errorf("Processed = %+v", p.Processed())
			}
		})
	}
}
