package exchange_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/providertest"
)

// The providertest provider speaks the OpenAI shape only, so these tests
// give it recorded Anthropic bodies to return verbatim through
// providertest.Status, over the same engine and HTTP/2 as the OpenAI tests.

// newAnthropicHarness is a harness whose attempts go through CallRoute,
// so the dispatch is exercised too.
func newAnthropicHarness(t *testing.T) *harness {
	h := newHarness(t)
	h.adapter = exchange.CallRoute
	return h
}

func (h *harness) claude() routes.Route {
	return routes.Route{Name: "claude", Kind: routes.KindAnthropic, BaseURL: h.p.URL() + "/v1", Model: "claude-test"}
}

// A recorded Messages response (API reference example, trimmed), plus a
// member this adapter does not know, which must survive in Raw.
const recordedMessage = `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant",
"model":"claude-sonnet-4-5-20250929",
"content":[{"type":"text","text":"I'll check the weather."},
  {"type":"tool_use","id":"toolu_01A09q90qw90lq917835lq9","name":"get_weather","input":{"location":"San Francisco, CA","unit":"celsius"}}],
"stop_reason":"tool_use","stop_sequence":null,
"usage":{"input_tokens":384,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":77,"service_tier":"standard"},
"container":null}`

// events renders named SSE events as Anthropic sends them.
var events = providertest.AnthropicEvents

// Recorded stream events (Messages streaming documentation).
const (
	evMessageStart = `{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-test","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`
	evTextStart    = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	evPing         = `{"type": "ping"}`
	evHello        = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`
	evBang         = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}`
	evBlock0Stop   = `{"type":"content_block_stop","index":0}`
	evEndTurn      = `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`
	evMessageStop  = `{"type":"message_stop"}`
	evToolStart    = `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}`
	evToolEmpty    = `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`
	evToolArgs1    = `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}`
	evToolArgs2    = `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"San Francisco, CA\"}"}}`
	evToolUseStop  = `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}`
	evOverloaded   = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
)

func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("compact %s: %v", s, err)
	}
	return b.String()
}

// recordRequest returns a RoundTripper that records the one request it
// gets and answers it with a recorded Messages body.
func recordRequest(t *testing.T) (http.RoundTripper, func() (*http.Request, []byte)) {
	var sent *http.Request
	var body []byte
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if sent != nil {
			t.Fatal("sent twice")
		}
		sent = r
		body, _ = io.ReadAll(r.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(recordedMessage))}, nil
	})
	return rt, func() (*http.Request, []byte) { return sent, body }
}

func raw(s string) json.RawMessage { return json.RawMessage(s) }

// neverSend is a RoundTripper for requests that must be refused first.
func neverSend(t *testing.T) http.RoundTripper {
	return roundTripFunc(func(*http.Request) (*http.Response, error) {
		t.Error("a refused request was sent")
		return nil, errors.New("not sent")
	})
}

// The exact JSON sent for each translation rule.
func TestAnthropicRequestTranslation(t *testing.T) {
	cases := []struct {
		name string
		req  providers.Request
		want string
	}{
		{
			name: "minimal, with the default max_tokens",
			req:  providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}},
			want: `{"model":"claude-test","max_tokens":1024,"messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name: "system and developer hoisted, params mapped or dropped",
			req: providers.Request{
				Messages: []providers.Message{
					providers.TextMessage("system", "be brief"),
					providers.TextMessage("user", "weather?"),
					{Role: "developer", Content: raw(`[{"type":"text","text":"use metric"}]`)},
				},
				Stream: true,
				Params: map[string]json.RawMessage{
					"max_completion_tokens": raw(`256`), "temperature": raw(`0.2`), "top_p": raw(`0.9`),
					"stop": raw(`"END"`), "user": raw(`"u-42"`), "seed": raw(`7`), "frequency_penalty": raw(`0`),
					"stream_options": raw(`{"include_usage":true}`), "n": raw(`1`), "top_k": raw(`40`), "logprobs": raw(`null`),
				},
			},
			want: `{"model":"claude-test","max_tokens":256,
				"system":[{"type":"text","text":"be brief"},{"type":"text","text":"use metric"}],
				"messages":[{"role":"user","content":"weather?"}],
				"stop_sequences":["END"],"temperature":0.2,"top_p":0.9,"top_k":40,
				"metadata":{"user_id":"u-42"},"stream":true}`,
		},
		{
			name: "tools, required choice, parallel calls off, a tool round trip",
			req: providers.Request{
				Messages: []providers.Message{
					providers.TextMessage("user", "weather in SF and NYC?"),
					{Role: "assistant", Content: raw(`null`), ToolCalls: raw(`[
						{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"SF\"}"}},
						{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"NYC\"}"}}]`)},
					{Role: "tool", ToolCallID: "call_1", Content: raw(`"18C"`)},
					{Role: "tool", ToolCallID: "call_2", Content: raw(`[{"type":"text","text":"22C"}]`)},
					providers.TextMessage("user", "thanks"),
				},
				Tools: []json.RawMessage{
					raw(`{"type":"function","function":{"name":"get_weather","description":"Current weather","strict":true,
						"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`),
					raw(`{"type":"function","function":{"name":"now"}}`),
				},
				ToolChoice: raw(`"required"`),
				Params:     map[string]json.RawMessage{"parallel_tool_calls": raw(`false`), "max_tokens": raw(`100`), "max_completion_tokens": raw(`50`)},
			},
			want: `{"model":"claude-test","max_tokens":100,
				"messages":[
					{"role":"user","content":"weather in SF and NYC?"},
					{"role":"assistant","content":[
						{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"SF"}},
						{"type":"tool_use","id":"call_2","name":"get_weather","input":{"city":"NYC"}}]},
					{"role":"user","content":[
						{"type":"tool_result","tool_use_id":"call_1","content":"18C"},
						{"type":"tool_result","tool_use_id":"call_2","content":[{"type":"text","text":"22C"}]}]},
					{"role":"user","content":"thanks"}],
				"tools":[
					{"name":"get_weather","description":"Current weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},
					{"name":"now","input_schema":{"type":"object","properties":{}}}],
				"tool_choice":{"type":"any","disable_parallel_tool_use":true}}`,
		},
		{
			name: "assistant text before a call, a named tool choice, a text response_format",
			req: providers.Request{
				Messages: []providers.Message{
					providers.TextMessage("user", "look it up"),
					{Role: "assistant", Content: raw(`"Let me look."`), ToolCalls: raw(`[{"id":"call_9","type":"function","function":{"name":"lookup","arguments":""}}]`)},
					{Role: "tool", ToolCallID: "call_9", Content: raw(`""`)},
				},
				Tools:          []json.RawMessage{raw(`{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}`)},
				ToolChoice:     raw(`{"type":"function","function":{"name":"lookup"}}`),
				ResponseFormat: raw(`{"type":"text"}`),
			},
			want: `{"model":"claude-test","max_tokens":1024,
				"messages":[
					{"role":"user","content":"look it up"},
					{"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"call_9","name":"lookup","input":{}}]},
					{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_9"}]}],
				"tools":[{"name":"lookup","input_schema":{"type":"object"}}],
				"tool_choice":{"type":"tool","name":"lookup"}}`,
		},
		{
			name: "images: a data URL and an https URL",
			req: providers.Request{Messages: []providers.Message{{Role: "user", Content: raw(`[
				{"type":"text","text":"what is this?"},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"high"}},
				{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]`)}}},
			want: `{"model":"claude-test","max_tokens":1024,"messages":[{"role":"user","content":[
				{"type":"text","text":"what is this?"},
				{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
				{"type":"image","source":{"type":"url","url":"https://example.com/cat.jpg"}}]}]}`,
		},
		{
			name: "tool_choice none keeps parallel calls alone, stop as an array",
			req: providers.Request{
				Messages:   []providers.Message{providers.TextMessage("user", "hi")},
				Tools:      []json.RawMessage{raw(`{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}`)},
				ToolChoice: raw(`"none"`),
				Params:     map[string]json.RawMessage{"stop": raw(`["a","b"]`), "parallel_tool_calls": raw(`false`)},
			},
			want: `{"model":"claude-test","max_tokens":1024,"messages":[{"role":"user","content":"hi"}],
				"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"none"},"stop_sequences":["a","b"]}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt, got := recordRequest(t)
			route := routes.Route{Name: "claude", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/v1", Model: "claude-test"}
			if _, err := exchange.CallAnthropic(context.Background(), rt, exchange.Call{Route: route, Request: tc.req}); err != nil {
				t.Fatal(err)
			}
			_, body := got()
			if string(body) != compactJSON(t, tc.want) {
				t.Fatalf("sent %s\nwant %s", body, compactJSON(t, tc.want))
			}
		})
	}
}

// What the Messages API cannot express is refused before sending, with
// an error naming the field.
func TestAnthropicRequestRefusals(t *testing.T) {
	user := providers.TextMessage("user", "hi")
	with := func(f func(*providers.Request)) providers.Request {
		r := providers.Request{Messages: []providers.Message{user}}
		f(&r)
		return r
	}
	cases := []struct {
		name  string
		req   providers.Request
		is    error
		field string
	}{
		{"json_schema response_format", with(func(r *providers.Request) {
			r.ResponseFormat = raw(`{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object"},"strict":true}}`)
		}), exchange.ErrUnsupported, "response_format"},
		{"json_object response_format", with(func(r *providers.Request) { r.ResponseFormat = raw(`{"type":"json_object"}`) }), exchange.ErrUnsupported, "response_format"},
		{"several choices", with(func(r *providers.Request) { r.Params = map[string]json.RawMessage{"n": raw(`2`)} }), exchange.ErrUnsupported, `params["n"]`},
		{"unknown param", with(func(r *providers.Request) { r.Params = map[string]json.RawMessage{"web_search_options": raw(`{}`)} }), exchange.ErrUnsupported, `params["web_search_options"]`},
		{"zero max_tokens", with(func(r *providers.Request) { r.Params = map[string]json.RawMessage{"max_tokens": raw(`0`)} }), providers.ErrInvalidRequest, `params["max_tokens"]`},
		{"stop twice", with(func(r *providers.Request) {
			r.Params = map[string]json.RawMessage{"stop": raw(`"x"`), "stop_sequences": raw(`["y"]`)}
		}), exchange.ErrUnsupported, `params["stop_sequences"]`},
		{"function role", with(func(r *providers.Request) { r.Messages = append(r.Messages, providers.TextMessage("function", "x")) }), exchange.ErrUnsupported, "messages[1].role"},
		{"audio part", with(func(r *providers.Request) {
			r.Messages[0].Content = raw(`[{"type":"text","text":"hi"},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]`)
		}), exchange.ErrUnsupported, "messages[0].content[1].type"},
		{"image in the system prompt", with(func(r *providers.Request) {
			r.Messages = append([]providers.Message{{Role: "system", Content: raw(`[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]`)}}, r.Messages...)
		}), exchange.ErrUnsupported, "messages[0].content[0]"},
		{"image by file path", with(func(r *providers.Request) {
			r.Messages[0].Content = raw(`[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]`)
		}), exchange.ErrUnsupported, "messages[0].content[0].image_url"},
		{"custom tool", with(func(r *providers.Request) {
			r.Tools = []json.RawMessage{raw(`{"type":"custom","function":{"name":"x"}}`)}
		}), exchange.ErrUnsupported, "tools[0].type"},
		{"arguments not an object", with(func(r *providers.Request) {
			r.Messages = append(r.Messages, providers.Message{Role: "assistant", ToolCalls: raw(`[{"id":"c","type":"function","function":{"name":"f","arguments":"[1,2]"}}]`)})
		}), exchange.ErrUnsupported, "messages[1].tool_calls[0].function.arguments"},
		{"tool result without an id", with(func(r *providers.Request) { r.Messages = append(r.Messages, providers.TextMessage("tool", "42")) }), providers.ErrInvalidRequest, "messages[1].tool_call_id"},
		{"system prompt only", providers.Request{Messages: []providers.Message{providers.TextMessage("system", "x")}}, exchange.ErrUnsupported, "messages"},
		{"allowed_tools choice", with(func(r *providers.Request) { r.ToolChoice = raw(`{"type":"allowed_tools","allowed_tools":{}}`) }), exchange.ErrUnsupported, "tool_choice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt := neverSend(t)
			route := routes.Route{Name: "claude", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}
			res, err := exchange.CallRoute(context.Background(), rt, exchange.Call{Route: route, Request: tc.req})
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("err = %v, want %v naming %s", err, tc.is, tc.field)
			}
			if !strings.Contains(err.Error(), `route "claude"`) || res.Signal != evidence.SignalNone {
				t.Fatalf("err %v signal %q", err, res.Signal)
			}
		})
	}
	// Every problem at once.
	req := with(func(r *providers.Request) {
		r.ResponseFormat = raw(`{"type":"json_object"}`)
		r.Params = map[string]json.RawMessage{"n": raw(`3`)}
	})
	_, err := exchange.CallAnthropic(context.Background(), neverSend(t), exchange.Call{
		Route: routes.Route{Name: "c", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}, Request: req})
	if msg := fmt.Sprint(err); !strings.Contains(msg, "response_format:") || !strings.Contains(msg, `params["n"]:`) {
		t.Fatalf("not every problem reported: %v", err)
	}
}

func TestAnthropicNonStreaming(t *testing.T) {
	h := newAnthropicHarness(t)
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("sk-ant-test-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := capture(h.p, providertest.Status(200, nil, recordedMessage))
	route := h.claude()
	route.APIKeyFile = keyFile
	o := h.call(context.Background(), route, chat(false), nil)
	if o.err != nil {
		t.Fatal(o.err)
	}
	o.want(t, evidence.Completed)
	r := o.res.Response
	wantCalls := `[{"id":"toolu_01A09q90qw90lq917835lq9","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"San Francisco, CA\",\"unit\":\"celsius\"}"}}]`
	if r.Text != "I'll check the weather." || string(r.ToolCalls) != wantCalls || r.FinishReason != "tool_calls" ||
		r.ID != "msg_01XFDUDYJgAACzvnptvVoYEL" || r.Model != "claude-sonnet-4-5-20250929" || r.Partial {
		t.Fatalf("response %+v\ntool calls %s", r, r.ToolCalls)
	}
	if r.Usage != (providers.Usage{PromptTokens: 484, CompletionTokens: 77, TotalTokens: 561, CachedTokens: 100}) {
		t.Fatalf("usage %+v (cache reads count as prompt tokens, and as cached ones)", r.Usage)
	}
	if !strings.Contains(string(r.Raw), `"container":null`) {
		t.Fatal("an unknown member did not survive in Raw")
	}
	sent := got()
	if sent.Path != "/v1/messages" || sent.Method != http.MethodPost || sent.Model != "claude-test" || sent.Stream {
		t.Fatalf("request %s %s model %q stream %v", sent.Method, sent.Path, sent.Model, sent.Stream)
	}
	hd := sent.Header
	if hd.Get("X-Api-Key") != "sk-ant-test-123" || hd.Get("Anthropic-Version") != "2023-06-01" || hd.Get("Authorization") != "" ||
		hd.Get("Content-Type") != "application/json" || hd.Get("Accept") != "application/json" {
		t.Fatalf("headers %v", hd)
	}
	if sent.IdempotencyKey != "key-"+t.Name() || h.p.ExecutedCount("key-"+t.Name()) != 1 {
		t.Fatal("not sent through the engine exactly once")
	}
}

func TestAnthropicStreaming(t *testing.T) {
	h := newAnthropicHarness(t)
	got := capture(h.p, providertest.Status(200, sseHeader, events(evMessageStart, evTextStart, evPing, evHello, evBang, evBlock0Stop, evEndTurn, evMessageStop)))
	sink := &recSink{}
	o := h.call(context.Background(), h.claude(), chat(true), sink)
	if o.err != nil {
		t.Fatal(o.err)
	}
	o.want(t, evidence.Completed)
	r := o.res.Response
	if r.Text != "Hello!" || r.FinishReason != "stop" || r.ID != "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY" || r.Partial || r.ToolCalls != nil {
		t.Fatalf("response %+v", r)
	}
	if r.Usage != (providers.Usage{PromptTokens: 25, CompletionTokens: 15, TotalTokens: 40}) {
		t.Fatalf("usage %+v", r.Usage)
	}
	if strings.Join(sink.deltas, "|") != "Hello|!" || len(sink.incomplete) != 0 || !o.ev.ContentStarted {
		t.Fatalf("sink %q incomplete %q evidence %+v", sink.deltas, sink.incomplete, o.ev)
	}
	var body map[string]any
	if err := json.Unmarshal(got().Body, &body); err != nil {
		t.Fatal(err)
	}
	if body["stream"] != true || body["stream_options"] != nil || got().Header.Get("Accept") != "text/event-stream" {
		t.Fatalf("body %s", got().Body)
	}
}

func TestAnthropicToolUseStream(t *testing.T) {
	h := newAnthropicHarness(t)
	h.p.Push(providertest.Status(200, sseHeader, events(evMessageStart, evTextStart, evPing,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":", let's check the weather."}}`,
		evBlock0Stop, evToolStart, evToolEmpty, evToolArgs1, evToolArgs2,
		`{"type":"content_block_stop","index":1}`, evToolUseStop, evMessageStop)))
	sink := &recSink{}
	o := h.call(context.Background(), h.claude(), chat(true), sink)
	if o.err != nil {
		t.Fatal(o.err)
	}
	o.want(t, evidence.Completed)
	r := o.res.Response
	want := `[{"id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","type":"function","function":{"name":"get_weather","arguments":"{\"location\": \"San Francisco, CA\"}"}}]`
	if string(r.ToolCalls) != want || r.FinishReason != "tool_calls" || r.Text != "Okay, let's check the weather." {
		t.Fatalf("response %+v\ntool calls %s", r, r.ToolCalls)
	}
	if sink.text() != r.Text || r.Usage.CompletionTokens != 89 {
		t.Fatalf("sink %q usage %+v", sink.deltas, r.Usage)
	}
}

// A stream that is all tool call commits at the tool_use block's start,
// and one cut mid-arguments is a partial answer, not a silent retry.
func TestAnthropicToolUseStreamCut(t *testing.T) {
	h := newAnthropicHarness(t)
	h.p.Push(providertest.Status(200, sseHeader, events(evMessageStart, evPing, evToolStart, evToolArgs1)))
	sink := &recSink{}
	o := h.call(context.Background(), h.claude(), chat(true), sink)
	if o.err != nil {
		t.Fatal(o.err)
	}
	r := o.res.Response
	want := `[{"id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","type":"function","function":{"name":"get_weather","arguments":"{\"location\":"}}]`
	if !r.Partial || r.Incomplete != providers.IncompleteTruncated || string(r.ToolCalls) != want || !o.ev.ContentStarted {
		t.Fatalf("response %+v tool calls %s evidence %+v", r, r.ToolCalls, o.ev)
	}
	if len(sink.deltas) != 0 || len(sink.incomplete) != 1 || sink.incomplete[0] != providers.IncompleteTruncated {
		t.Fatalf("sink %q incomplete %q", sink.deltas, sink.incomplete)
	}
	// As the CallModel activity finishes a partial response.
	ev := o.ev
	ev.Signal = evidence.SignalStreamIncomplete
	if c := evidence.Classify(ev); c.Class != evidence.CommittedPartial {
		t.Fatalf("classified %s", c.Class)
	}
}

// Cut after the first text delta, three ways: a clean end without
// message_stop (through the engine), a connection that dies, a stall.
func TestAnthropicStreamCutAfterFirstTextDelta(t *testing.T) {
	head := events(evMessageStart, evTextStart, evHello)
	t.Run("truncated", func(t *testing.T) {
		h := newAnthropicHarness(t)
		h.p.Push(providertest.Status(200, sseHeader, head))
		sink := &recSink{}
		o := h.call(context.Background(), h.claude(), chat(true), sink)
		r := o.res.Response
		if o.err != nil || !r.Partial || r.Incomplete != providers.IncompleteTruncated || r.Text != "Hello" || sink.text() != "Hello" {
			t.Fatalf("err %v response %+v sink %q", o.err, r, sink.deltas)
		}
		if len(sink.incomplete) != 1 || !o.ev.ContentStarted {
			t.Fatalf("incomplete %q evidence %+v", sink.incomplete, o.ev)
		}
	})
	for _, tc := range []struct {
		name   string
		end    func(w *io.PipeWriter)
		route  func(*routes.Route)
		reason string
	}{
		{"connection lost", func(w *io.PipeWriter) { w.CloseWithError(io.ErrUnexpectedEOF) }, nil, providers.IncompleteConnectionClosed},
		{"stalled", func(*io.PipeWriter) {}, func(r *routes.Route) { r.IdleTimeout = short }, providers.IncompleteIdleTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, w := pipeTransport()
			route := routes.Route{Name: "pipe", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}
			if tc.route != nil {
				tc.route(&route)
			}
			go func() {
				_, _ = io.WriteString(w, head)
				tc.end(w)
			}()
			sink := &recSink{}
			res, err := exchange.CallRoute(context.Background(), rt, exchange.Call{Route: route, Request: chat(true), Sink: sink})
			r := res.Response
			if err != nil || !r.Partial || r.Incomplete != tc.reason || r.Text != "Hello" || sink.text() != "Hello" {
				t.Fatalf("err %v response %+v sink %q", err, r, sink.deltas)
			}
			if len(sink.incomplete) != 1 || sink.incomplete[0] != tc.reason {
				t.Fatalf("sink incomplete %q", sink.incomplete)
			}
		})
	}
}

func TestAnthropicStreamsWithoutContent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		signal evidence.Signal
		class  evidence.Class
	}{
		// message_start, pings and an empty text block are not content.
		{"nothing said", events(evMessageStart, evPing, evTextStart, evBlock0Stop, evEndTurn, evMessageStop), evidence.SignalEmptyResponse, evidence.EmptyResponse},
		{"refusal", events(evMessageStart, `{"type":"message_delta","delta":{"stop_reason":"refusal"},"usage":{"output_tokens":2}}`, evMessageStop), evidence.SignalContentFiltered, evidence.ContentFiltered},
		// Anthropic reports overload in-band on a 200 stream.
		{"overloaded before content", events(evMessageStart, evPing, evOverloaded), evidence.SignalOverloaded, evidence.Throttled},
		{"rate limited before content", events(evMessageStart, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`), evidence.SignalOverloaded, evidence.Throttled},
		{"api error before content", events(evMessageStart, `{"type":"error","error":{"type":"api_error","message":"oops"}}`), evidence.SignalEmptyResponse, evidence.EmptyResponse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newAnthropicHarness(t)
			h.p.Push(providertest.Status(200, sseHeader, tc.body))
			sink := &recSink{}
			o := h.call(context.Background(), h.claude(), chat(true), sink)
			if o.err != nil || o.res.Signal != tc.signal {
				t.Fatalf("err %v signal %q, want %q", o.err, o.res.Signal, tc.signal)
			}
			o.want(t, tc.class)
			if o.ev.ContentStarted || len(sink.deltas) != 0 || len(sink.incomplete) != 0 {
				t.Fatalf("committed or delivered without content: %+v sink %q %q", o.ev, sink.deltas, sink.incomplete)
			}
		})
	}
}

func TestAnthropicErrorEventAfterContent(t *testing.T) {
	h := newAnthropicHarness(t)
	h.p.Push(providertest.Status(200, sseHeader, events(evMessageStart, evTextStart, evHello, evOverloaded, evBang)))
	sink := &recSink{}
	o := h.call(context.Background(), h.claude(), chat(true), sink)
	if o.err != nil {
		t.Fatal(o.err)
	}
	r := o.res.Response
	if !r.Partial || r.Incomplete != providers.IncompleteProviderError || r.Text != "Hello" || r.Error == nil || r.Error.Type != "overloaded_error" {
		t.Fatalf("response %+v", r)
	}
	if sink.text() != "Hello" || len(sink.incomplete) != 1 || sink.incomplete[0] != providers.IncompleteProviderError {
		t.Fatalf("sink %q incomplete %q", sink.deltas, sink.incomplete)
	}
	o.want(t, evidence.CommittedPartial)
}

func TestAnthropicErrorStatusMapping(t *testing.T) {
	body := func(typ, msg string) string {
		b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}, "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"})
		return string(b)
	}
	cases := []statusCase{
		{"overloaded 529", providertest.Status(529, nil, body("overloaded_error", "Overloaded")), evidence.SignalOverloaded, evidence.Throttled},
		{"rate limited 429", providertest.Status(429, providertest.RetryAfterSeconds(3), body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit")), evidence.SignalOverloaded, evidence.Throttled},
		{"model not found", providertest.Status(404, nil, body("not_found_error", "model: claude-nope")), evidence.SignalModelNotFound, evidence.IncompatibleRoute},
		{"prompt too long", providertest.Status(400, nil, body("invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum")), evidence.SignalContextTooLong, evidence.IncompatibleRoute},
		{"input and max_tokens past the window", providertest.Status(400, nil, body("invalid_request_error", "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again")), evidence.SignalContextTooLong, evidence.IncompatibleRoute},
		{"bad request", providertest.Status(400, nil, body("invalid_request_error", "messages.0.content: Field required")), evidence.SignalNone, evidence.Rejected},
		{"bad key", providertest.Status(401, nil, body("authentication_error", "invalid x-api-key")), evidence.SignalNone, evidence.Rejected},
		{"forbidden", providertest.Status(403, nil, body("permission_error", "no access")), evidence.SignalNone, evidence.Rejected},
		{"too large", providertest.Status(413, nil, body("request_too_large", "Request exceeds the maximum allowed number of bytes.")), evidence.SignalNone, evidence.Rejected},
		{"api error 500", providertest.Status(500, nil, body("api_error", "Internal server error")), evidence.SignalNone, evidence.UpstreamError},
		{"html 502", providertest.Status(502, http.Header{"Content-Type": {"text/html"}}, "<html>bad gateway</html>"), evidence.SignalNone, evidence.UpstreamError},
	}
	checkStatusCases(t, cases, newAnthropicHarness, (*harness).claude)
	// Through an intermediary, Anthropic's own 502 is its error object;
	// the proxy's is not.
	checkStatusCases(t, []statusCase{
		{"anthropic's own 502 via an intermediary", providertest.Status(502, nil, body("api_error", "Bad gateway")), evidence.SignalNone, evidence.UpstreamError},
		{"the proxy's 502", providertest.Status(502, http.Header{"Content-Type": {"text/html"}}, "<html>bad gateway</html>"), evidence.SignalNone, evidence.Ambiguous},
	}, newAnthropicHarness, func(h *harness) routes.Route {
		r := h.claude()
		r.Intermediary = true
		return r
	})
}

// The shared timers serve this dialect too.
func TestAnthropicFirstByteTimeout(t *testing.T) {
	h := newAnthropicHarness(t)
	h.p.Push(providertest.Hold())
	route := h.claude()
	route.FirstByteTimeout = short
	o := h.call(context.Background(), route, chat(true), &recSink{})
	if !errors.Is(o.err, exchange.ErrFirstByteTimeout) {
		t.Fatalf("err = %v", o.err)
	}
	o.want(t, evidence.Ambiguous)
}

func TestCallRouteDispatch(t *testing.T) {
	var sent *http.Request
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`))}, nil
	})
	t.Setenv("DURALLM_TEST_DISPATCH_KEY", "k-123")
	base := routes.Route{Name: "r", BaseURL: "http://127.0.0.1:1/v1", Model: "m", APIKeyEnv: "DURALLM_TEST_DISPATCH_KEY"}
	for _, tc := range []struct {
		kind, path, header, value string
	}{
		{routes.KindOpenAI, "/v1/chat/completions", "Authorization", "Bearer k-123"},
		{"", "/v1/chat/completions", "Authorization", "Bearer k-123"},
		{routes.KindAnthropic, "/v1/messages", "X-Api-Key", "k-123"},
	} {
		sent = nil
		route := base
		route.Kind = tc.kind
		if _, err := exchange.CallRoute(context.Background(), rt, exchange.Call{Route: route, Request: chat(false)}); err != nil {
			t.Fatalf("kind %q: %v", tc.kind, err)
		}
		if sent.URL.Path != tc.path || sent.Header.Get(tc.header) != tc.value {
			t.Fatalf("kind %q: sent to %s with %v", tc.kind, sent.URL.Path, sent.Header)
		}
	}
	sent = nil
	route := base
	route.Kind = "gemini"
	if _, err := exchange.CallRoute(context.Background(), rt, exchange.Call{Route: route, Request: chat(false)}); !errors.Is(err, exchange.ErrUnknownKind) || sent != nil {
		t.Fatalf("unknown kind: err %v, sent %v", err, sent != nil)
	}
	route.Kind = routes.KindOpenAI
	if _, err := exchange.CallAnthropic(context.Background(), rt, exchange.Call{Route: route, Request: chat(false)}); !errors.Is(err, exchange.ErrWrongKind) || sent != nil {
		t.Fatalf("an openai route through CallAnthropic: err %v, sent %v", err, sent != nil)
	}
}

// No prompt, output or key reaches an error string, nor the engine's
// attempt events, on the paths this dialect adds (docs/contract.md section 7).
func TestAnthropicNoContentOrKeyInErrors(t *testing.T) {
	const (
		promptCanary = "CANARY-PROMPT-a41c"
		outputCanary = "CANARY-OUTPUT-9d3e"
		keyCanary    = "sk-ant-CANARY-KEY-5b7f"
	)
	t.Setenv("DURALLM_TEST_ANTHROPIC_KEY", keyCanary)
	h := newAnthropicHarness(t)
	route := h.claude()
	route.APIKeyEnv = "DURALLM_TEST_ANTHROPIC_KEY"
	msgs := []providers.Message{providers.TextMessage("system", "secret "+promptCanary), providers.TextMessage("user", promptCanary)}
	req := func(stream bool, f func(*providers.Request)) providers.Request {
		r := providers.Request{Messages: msgs, Stream: stream}
		if f != nil {
			f(&r)
		}
		return r
	}
	echo := `{"type":"error","error":{"type":"invalid_request_error","message":"bad prompt ` + promptCanary + ` key ` + keyCanary + `"}}`
	textEvent := `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + outputCanary + `"}}`

	got := capture(h.p, providertest.Status(200, sseHeader, events(evMessageStart, textEvent, evEndTurn, evMessageStop)))
	if o := h.call(context.Background(), route, req(true, nil), &recSink{}); o.err != nil || o.res.Response.Text != outputCanary {
		t.Fatalf("the canaries must actually flow: %v %+v", o.err, o.res.Response)
	}
	if got().Header.Get("X-Api-Key") != keyCanary || !strings.Contains(string(got().Body), promptCanary) {
		t.Fatal("key or prompt not sent")
	}
	h.p.Script(nil)

	for _, sc := range []struct {
		name  string
		b     *providertest.Behavior
		req   providers.Request
		noErr bool
	}{
		{name: "refused response_format", req: req(false, func(r *providers.Request) {
			r.ResponseFormat = raw(`{"type":"json_schema","json_schema":{"name":"` + promptCanary + `","schema":{}}}`)
		})},
		{name: "refused tool arguments", req: req(false, func(r *providers.Request) {
			r.Messages = append(r.Messages, providers.Message{Role: "assistant", ToolCalls: raw(`[{"id":"c","function":{"name":"f","arguments":"` + promptCanary + `"}}]`)})
		})},
		{name: "refused content part", req: req(false, func(r *providers.Request) {
			r.Messages = append(r.Messages, providers.Message{Role: "user", Content: raw(`[{"type":"` + promptCanary + `"}]`)})
		})},
		{name: "refused image URL", req: req(false, func(r *providers.Request) {
			r.Messages = append(r.Messages, providers.Message{Role: "user", Content: raw(`[{"type":"image_url","image_url":{"url":"ftp://` + promptCanary + `"}}]`)})
		})},
		{name: "malformed body", b: ptr(providertest.Status(200, nil, `{"content":[{"type":"text","text":"`+outputCanary)), req: req(false, nil)},
		{name: "malformed stream", b: ptr(providertest.Status(200, sseHeader, events(evMessageStart)+"data: {"+outputCanary+"\n\n")), req: req(true, nil)},
		{name: "first-byte timeout", b: ptr(providertest.Hold()), req: req(true, nil)},
		{name: "error body echoing the prompt", b: ptr(providertest.Status(400, nil, echo)), req: req(false, nil), noErr: true},
		{name: "error event echoing the prompt", b: ptr(providertest.Status(200, sseHeader, events(echo))), req: req(true, nil), noErr: true},
	} {
		t.Run(sc.name, func(t *testing.T) {
			if sc.b != nil {
				h.p.Push(*sc.b)
			}
			r := route
			r.FirstByteTimeout = short
			o := h.call(context.Background(), r, sc.req, &recSink{})
			switch {
			case sc.noErr && o.err != nil:
				t.Fatalf("unexpected error %v", o.err)
			case !sc.noErr && o.err == nil:
				t.Fatalf("no error (result %+v)", o.res)
			}
			for _, c := range []string{promptCanary, outputCanary, keyCanary} {
				if strings.Contains(fmt.Sprint(o.err), c) {
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

// The client gives a non-streamed request a timer of its own (ten minutes)
// when the attempt may run longer, and cancels it as soon as it has handed
// back an error status: the exchange reads the provider's error body
// after that, so the request must not go out under the client's timer.
func TestAnthropicErrorBodyIsReadOnALongAttempt(t *testing.T) {
	body := `{"type":"error","error":{"type":"not_found_error","message":"model: claude-nope"}}`
	checkStatusCases(t, []statusCase{
		{"model not found, attempt timeout 30m", providertest.Status(404, nil, body), evidence.SignalModelNotFound, evidence.IncompatibleRoute},
	}, newAnthropicHarness, func(h *harness) routes.Route {
		r := h.claude()
		r.AttemptTimeout = 30 * time.Minute
		return r
	})
}
