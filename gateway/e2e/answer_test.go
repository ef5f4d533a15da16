package e2e_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/durallm/durallm/gateway"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// A JSON answer equals the provider's, under the action's id, with the
// action's headers and no x-should-retry.
func TestGatewayJSONAnswerIsTheProviders(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.Answer("hello from the provider"))
	var raw *http.Response
	c := s.client(tokenA)
	got, err := c.Chat.Completions.New(testCtx(t), chatParams("demo", "say hello"), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	id := raw.Header.Get("X-Durallm-Action-Id")
	if got.Choices[0].Message.Content != "hello from the provider" || got.ID != id || got.Model != "demo" || !strings.HasPrefix(id, "gw-") {
		t.Fatalf("completion %+v, action %s", got, id)
	}
	if raw.Header.Get("X-Request-Id") != id || raw.Header.Get("X-Durallm-State") != "completed" || raw.Header.Get("X-Should-Retry") != "" {
		t.Fatalf("headers %v", raw.Header)
	}
	if got.Usage.TotalTokens == 0 || got.Choices[0].FinishReason != "stop" {
		t.Fatalf("usage %+v finish %q", got.Usage, got.Choices[0].FinishReason)
	}
	// Upstream, the attempt's Idempotency-Key is the action id.
	if rec := s.p.Received(); len(rec) != 1 || rec[0].IdempotencyKey != id {
		t.Fatalf("upstream requests %+v", rec)
	}
}

// A streamed answer equals the provider's; include_usage ends it with the
// usage chunk; every chunk carries the action's id.
func TestGatewayStreamedAnswerIsTheProviders(t *testing.T) {
	s := newGateway(t)
	const text = "one two three four"
	s.p.Push(providertest.Answer(text))
	c := s.client(tokenA)
	params := chatParams("demo", "count")
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(testCtx(t), params)
	var acc openai.ChatCompletionAccumulator
	var chunks []openai.ChatCompletionChunk
	for stream.Next() {
		ch := stream.Current()
		chunks = append(chunks, ch)
		if !acc.AddChunk(ch) {
			t.Fatalf("the accumulator refused chunk %+v", ch)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.Content; got != text {
		t.Fatalf("streamed %q, want %q", got, text)
	}
	last := chunks[len(chunks)-1]
	if len(last.Choices) != 0 || last.Usage.TotalTokens == 0 {
		t.Fatalf("the last chunk is not the usage chunk: %+v", last)
	}
	if acc.Choices[0].FinishReason != "stop" || !strings.HasPrefix(chunks[0].ID, "gw-") {
		t.Fatalf("finish %q id %q", acc.Choices[0].FinishReason, chunks[0].ID)
	}
	// Upstream streamed with usage asked for.
	if rec := s.p.Received(); len(rec) != 1 || !rec[0].Stream {
		t.Fatalf("upstream %+v", rec)
	}
}

// Without include_usage, no usage chunk.
func TestGatewayStreamWithoutUsageOption(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.Answer("a b"))
	stream := s.client(tokenA).Chat.Completions.NewStreaming(testCtx(t), chatParams("demo", "x"))
	n := 0
	for stream.Next() {
		if len(stream.Current().Choices) == 0 {
			t.Fatal("a usage chunk nobody asked for")
		}
		n++
	}
	if stream.Err() != nil || n == 0 {
		t.Fatalf("%d chunks, %v", n, stream.Err())
	}
}

// Tool calls stream as deltas that openai-go's accumulator rebuilds, and
// the JSON answer carries them as the provider sent them.
func TestGatewayAccumulatorRebuildsToolCalls(t *testing.T) {
	s := newGateway(t)
	events := []string{
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]}}]}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`,
		`[DONE]`,
	}
	var body strings.Builder
	for _, e := range events {
		body.WriteString("data: " + e + "\n\n")
	}
	s.p.Push(providertest.Status(200, http.Header{"Content-Type": {"text/event-stream"}}, body.String()))
	params := chatParams("demo", "weather?")
	params.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "get_weather"})}
	stream := s.client(tokenA).Chat.Completions.NewStreaming(testCtx(t), params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 2 || calls[0].ID != "call_1" || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments != `{"city":"Paris"}` ||
		calls[1].ID != "call_2" || calls[1].Function.Arguments != "{}" || acc.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("tool calls %+v finish %q", calls, acc.Choices[0].FinishReason)
	}
}

// A stream cut after content: the deltas, then one in-band
// durallm_stream_incomplete error, no [DONE]: openai-go raises a
// *ssestream.StreamError.
func TestGatewayPartialStreamIsAStreamError(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.StreamCut(2, providertest.CutReset))
	stream := s.client(tokenA).Chat.Completions.NewStreaming(testCtx(t), chatParams("demo", "x"))
	var text strings.Builder
	for stream.Next() {
		if len(stream.Current().Choices) > 0 {
			text.WriteString(stream.Current().Choices[0].Delta.Content)
		}
	}
	var se *ssestream.StreamError
	if !errors.As(stream.Err(), &se) {
		t.Fatalf("stream error %T %v, want *ssestream.StreamError", stream.Err(), stream.Err())
	}
	var e struct {
		Error struct{ Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal(se.Event.Data, &e); err != nil || e.Error.Type != "durallm_stream_incomplete" || e.Error.Code != "reset" {
		t.Fatalf("in-band error %s", se.Event.Data)
	}
	if text.String() != "chunk1 chunk2" {
		t.Fatalf("deltas %q", text.String())
	}
	// The same action read as JSON: 200, finish_reason length, marked.
	ids := s.p.Received()
	id := ids[0].IdempotencyKey
	resp, body := s.do(testCtx(t), http.MethodGet, "/v1/actions/"+id, tokenA, "", nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Durallm-State") != string(workflows.StateCompletedPartial) || !strings.Contains(string(body), `"finish_reason":"length"`) {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
}

// A stream that fails before the commit gets a real status: here the
// provider's 400, passed back with its error object.
func TestGatewayStreamRejectedBeforeContentIsAStatus(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.Status(400, nil, `{"error":{"type":"invalid_request_error","code":"context_too_tiny","message":"no","param":"messages"}}`))
	stream := s.client(tokenA, option.WithMaxRetries(0)).Chat.Completions.NewStreaming(testCtx(t), chatParams("demo", "x"))
	for stream.Next() {
		t.Fatal("a chunk from a rejected request")
	}
	var ae *openai.Error
	if !errors.As(stream.Err(), &ae) || ae.StatusCode != 400 || ae.Code != "context_too_tiny" || ae.Type != "invalid_request_error" || ae.Param != "messages" {
		t.Fatalf("error %v", stream.Err())
	}
	if ae.Response.Header.Get("X-Should-Retry") != "false" || ae.Response.Header.Get("X-Durallm-State") != "rejected" {
		t.Fatalf("headers %v", ae.Response.Header)
	}
}

func TestGatewayModels(t *testing.T) {
	s := newGateway(t)
	page, err := s.client(tokenA).Models.List(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range page.Data {
		names = append(names, m.ID)
	}
	if strings.Join(names, ",") != "demo,primary" {
		t.Fatalf("models %v", names)
	}
}

// A body under the gateway's bound but over Temporal's payload limit is a
// 413 too, and nothing starts.
func TestGatewayBodyOverTemporalsPayloadLimit(t *testing.T) {
	s := newGateway(t)
	big := strings.Repeat("x", 3<<20)
	r, b := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, `{"model":"demo","messages":[{"role":"user","content":"`+big+`"}]}`, nil)
	if typ, code := errType(t, b); r.StatusCode != 413 || typ != "invalid_request_error" || code != "request_too_large" || r.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("%d %.300s", r.StatusCode, b)
	}
	if n := len(s.p.Received()); n != 0 {
		t.Fatalf("the provider received %d requests", n)
	}
}

// A completion is read back by its id (the action id), as OpenAI's stored
// completions are: openai-go's Chat.Completions.Get returns the same
// answer; another caller's is a 404.
func TestGatewayCompletionReadByItsID(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.Answer("kept for later"))
	c := s.client(tokenA)
	got, err := c.Chat.Completions.New(testCtx(t), chatParams("demo", "x"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Chat.Completions.Get(testCtx(t), got.ID)
	if err != nil || again.ID != got.ID || again.Choices[0].Message.Content != "kept for later" || again.Usage.TotalTokens != got.Usage.TotalTokens {
		t.Fatalf("read back %+v %v", again, err)
	}
	_, err = s.client(tokenB).Chat.Completions.Get(testCtx(t), got.ID)
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Fatalf("another caller read it: %v", err)
	}
}

// Every answer about an action says its state in x-durallm-state, with
// one of the action's states: a live stream (its attempt is producing),
// a replayed one and a read one (the terminal state), a JSON wait that
// reached its bound (the state it is in).
func TestAStreamSaysItsActionsState(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) {
		o.models.Models = append(o.models.Models, gateway.Model{Name: "brief", Routes: []string{"primary"}, MaxWait: 300 * time.Millisecond})
	})
	isState := func(v string) bool {
		switch workflows.State(v) {
		case workflows.StateQueued, workflows.StateDispatching, workflows.StateBackingOff, workflows.StateAwaitingReconciliation:
			return true
		}
		return workflows.State(v).Terminal()
	}
	s.p.Push(providertest.Answer("a b c"))
	key := map[string]string{"Idempotency-Key": "stated"}
	body := `{"model":"demo","stream":true,"messages":[{"role":"user","content":"x"}]}`
	live, _ := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, body, key)
	// A state, whichever: an action whose result reaches the gateway
	// before its first delta does begins its stream already completed.
	if st := live.Header.Get("X-Durallm-State"); !isState(st) {
		t.Fatalf("live stream: x-durallm-state %q", st)
	}
	id := live.Header.Get("X-Durallm-Action-Id")
	replayed, _ := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, body, key)
	if st := replayed.Header.Get("X-Durallm-State"); st != string(workflows.StateCompleted) || replayed.Header.Get("X-Durallm-Replayed") != "true" {
		t.Fatalf("replayed stream: x-durallm-state %q", st)
	}
	read := get(t, testCtx(t), s.srv.URL, "/v1/actions/"+id+"?stream=true")
	read.Body.Close()
	if st := read.Header.Get("X-Durallm-State"); st != string(workflows.StateCompleted) {
		t.Fatalf("read stream: x-durallm-state %q", st)
	}
	s.p.Push(providertest.Hold())
	waited, _ := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, `{"model":"brief","messages":[{"role":"user","content":"x"}]}`,
		map[string]string{"X-Durallm-On-Disconnect": "continue"})
	if st := waited.Header.Get("X-Durallm-State"); waited.StatusCode != http.StatusForbidden || !isState(st) || workflows.State(st).Terminal() {
		t.Fatalf("a wait past max_wait: %d x-durallm-state %q", waited.StatusCode, st)
	}
}
