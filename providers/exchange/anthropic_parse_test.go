package exchange

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

// Recorded and drifted Messages bodies.
func TestParseAnthropicMessageDriftedShapes(t *testing.T) {
	cases := []struct {
		name       string
		body       string
		wantText   string
		wantTools  string
		wantFinish string
		wantUsage  providers.Usage
		wantSig    evidence.Signal
		wantErr    error
	}{
		{
			name:       "text",
			body:       `{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":3}}`,
			wantText:   "Hi!",
			wantFinish: "stop",
			wantUsage:  providers.Usage{PromptTokens: 10, CompletionTokens: 3, TotalTokens: 13},
		},
		{
			name:       "thinking and server-tool blocks are skipped, text joined",
			body:       `{"content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"a"},{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"q"}},{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[]},{"type":"text","text":"b","citations":[]}],"stop_reason":"end_turn"}`,
			wantText:   "ab",
			wantFinish: "stop",
		},
		{
			name:       "tool_use with null, string and nested input",
			body:       `{"content":[{"type":"tool_use","id":"t1","name":"a","input":null},{"type":"tool_use","id":"t2","name":"b","input":"{\"x\":1}"},{"type":"tool_use","id":"t3","name":"c","input":{ "deep": [1, {"y": true}] }}],"stop_reason":"tool_use"}`,
			wantTools:  `[{"id":"t1","type":"function","function":{"name":"a","arguments":"{}"}},{"id":"t2","type":"function","function":{"name":"b","arguments":"{\"x\":1}"}},{"id":"t3","type":"function","function":{"name":"c","arguments":"{\"deep\":[1,{\"y\":true}]}"}}]`,
			wantFinish: "tool_calls",
		},
		{
			name:       "content as a string, numbers as strings, cache writes",
			body:       `{"content":"plain","stop_reason":"max_tokens","usage":{"input_tokens":"7","output_tokens":2.0,"cache_creation_input_tokens":"5","cache_read_input_tokens":null}}`,
			wantText:   "plain",
			wantFinish: "length",
			wantUsage:  providers.Usage{PromptTokens: 12, CompletionTokens: 2, TotalTokens: 14, CacheWriteTokens: 5},
		},
		{
			name:       "blocks without a type, and bare strings",
			body:       `{"content":[{"text":"x"},"y",42,null],"stop_reason":"stop_sequence"}`,
			wantText:   "xy",
			wantFinish: "stop",
		},
		{
			name:       "unknown stop_reason kept verbatim",
			body:       `{"content":[{"type":"text","text":"part one"}],"stop_reason":"pause_turn"}`,
			wantText:   "part one",
			wantFinish: "pause_turn",
		},
		{name: "refusal with nothing said", body: `{"content":[],"stop_reason":"refusal"}`, wantFinish: "content_filter", wantSig: evidence.SignalContentFiltered},
		{name: "null content", body: `{"id":"m","content":null,"stop_reason":"end_turn"}`, wantFinish: "stop", wantSig: evidence.SignalEmptyResponse},
		{name: "empty text block", body: `{"content":[{"type":"text","text":""}],"stop_reason":"end_turn"}`, wantFinish: "stop", wantSig: evidence.SignalEmptyResponse},
		{name: "error object on a 2xx", body: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, wantSig: evidence.SignalOverloaded},
		{name: "a bare array", body: `[1,2]`, wantSig: evidence.SignalEmptyResponse},
		{name: "empty body", body: ` `, wantSig: evidence.SignalEmptyResponse},
		{name: "not JSON", body: `<html>`, wantSig: evidence.SignalEmptyResponse, wantErr: ErrMalformedResponse},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, sig, err := parseAnthropicMessage([]byte(tc.body))
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if sig != tc.wantSig {
				t.Errorf("signal %q, want %q", sig, tc.wantSig)
			}
			if r.Text != tc.wantText || string(r.ToolCalls) != tc.wantTools || r.FinishReason != tc.wantFinish || r.Usage != tc.wantUsage {
				t.Errorf("text %q tools %s finish %q usage %+v", r.Text, r.ToolCalls, r.FinishReason, r.Usage)
			}
			if tc.wantErr == nil && strings.TrimSpace(tc.body) != "" && string(r.Raw) != strings.TrimSpace(tc.body) {
				t.Errorf("Raw is not the body: %s", r.Raw)
			}
		})
	}
}

func TestAnthropicErrorSignal(t *testing.T) {
	cases := []struct {
		body string
		want evidence.Signal
	}{
		{`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, evidence.SignalOverloaded},
		{`{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}`, evidence.SignalOverloaded},
		{`{"type":"error","error":{"type":"not_found_error","message":"model: claude-nope"}}`, evidence.SignalModelNotFound},
		{`{"type":"error","error":{"type":"invalid_request_error","message":"Prompt is too long: 210000 tokens > 200000 maximum"}}`, evidence.SignalContextTooLong},
		{`{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}`, evidence.SignalNone},
		{`{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`, evidence.SignalNone},
		{`{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`, evidence.SignalNone},
		// What errorSignal knows holds for this dialect too.
		{`{"error":{"type":"invalid_request_error","code":"context_length_exceeded"}}`, evidence.SignalContextTooLong},
		{`not json`, evidence.SignalNone},
	}
	for _, tc := range cases {
		if _, sig := parseAnthropicError([]byte(tc.body)); sig != tc.want {
			t.Errorf("%s: signal %q, want %q", tc.body, sig, tc.want)
		}
	}
	// OpenAI routes keep their own mapping: not_found_error means nothing
	// there.
	if _, sig := parseErrorBody([]byte(`{"type":"error","error":{"type":"not_found_error"}}`)); sig != evidence.SignalNone {
		t.Errorf("the OpenAI mapping changed: %q", sig)
	}
}

// Event by event: where the content starts, what the accumulator keeps.
func TestAnthropicStreamEvents(t *testing.T) {
	steps := []struct {
		name, data string
		wantText   string
		wantFirst  bool
	}{
		{"message_start", `{"type":"message_start","message":{"id":"msg_1","model":"claude-x","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}`, "", false},
		{"ping", `{"type":"ping"}`, "", false},
		// A tool call's start carries its name: content, so it commits.
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}`, "", true},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}`, "", false},
		{"content_block_delta", `{"index":0,"delta":{"type":"input_json_delta","partial_json":"1}"}}`, "", false}, // no "type": the event name says it
		{"content_block_stop", `{"type":"content_block_stop","index":0}`, "", false},
		{"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_2","name":"g","input":{"k":"v"}}}`, "", false},
		{"content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"thinking","thinking":""}}`, "", false},
		{"content_block_delta", `{"type":"content_block_delta","index":2,"delta":{"type":"thinking_delta","thinking":"hidden"}}`, "", false},
		{"content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"text","text":"pre"}}`, "pre", false},
		{"content_block_delta", `{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"fix"}}`, "fix", false},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"input_tokens":26,"output_tokens":40}}`, "", false},
	}
	acc := newAnthropicStreamAcc()
	for i, s := range steps {
		text, first, err := acc.event(s.name, []byte(s.data))
		if err != nil || text != s.wantText || first != s.wantFirst {
			t.Fatalf("step %d (%s): text %q first %v err %v", i, s.name, text, first, err)
		}
	}
	if !acc.complete() || acc.done {
		t.Fatal("a stop_reason completes the stream; only message_stop ends it")
	}
	if _, _, err := acc.event("message_stop", []byte(`{"type":"message_stop"}`)); err != nil || !acc.done {
		t.Fatalf("message_stop: %v", err)
	}
	r := acc.response()
	want := `[{"id":"toolu_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"toolu_2","type":"function","function":{"name":"g","arguments":"{\"k\":\"v\"}"}}]`
	if string(r.ToolCalls) != want || r.Text != "prefix" || r.FinishReason != "tool_calls" || r.ID != "msg_1" || r.Model != "claude-x" {
		t.Fatalf("response %+v\ntool calls %s", r, r.ToolCalls)
	}
	if r.Usage != (providers.Usage{PromptTokens: 31, CompletionTokens: 40, TotalTokens: 71, CachedTokens: 5}) {
		t.Fatalf("usage %+v: message_delta's counts replace message_start's", r.Usage)
	}
}

func TestAnthropicStreamErrorsAndBounds(t *testing.T) {
	for _, tc := range []struct {
		name, event, data string
		wantType          string
	}{
		{"error event", "error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, "overloaded_error"},
		{"flattened error", "error", `{"type":"api_error","message":"boom"}`, "api_error"},
		{"error without a name", "", `{"type":"error","error":{"type":"rate_limit_error"}}`, "rate_limit_error"},
	} {
		acc := newAnthropicStreamAcc()
		_, _, err := acc.event(tc.event, []byte(tc.data))
		if !errors.Is(err, errProviderError) || acc.resp.Error == nil || acc.resp.Error.Type != tc.wantType {
			t.Errorf("%s: err %v error %+v", tc.name, err, acc.resp.Error)
		}
	}
	acc := newAnthropicStreamAcc()
	if _, _, err := acc.event("", []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`)); !errors.Is(err, ErrMalformedStream) {
		t.Errorf("malformed: %v", err)
	}
	// Tool arguments count against the bound like text.
	acc = newAnthropicStreamAcc()
	acc.limit = toolCallOverhead + 20
	if _, _, err := acc.event("", []byte(`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}`)); err != nil {
		t.Fatal(err)
	}
	_, _, err := acc.event("", []byte(`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"`+strings.Repeat("x", 30)+`"}}`))
	if !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("err = %v, want ErrResponseTooLarge", err)
	}
}

// A tool call's streamed arguments, its pieces put together, are the
// arguments of the answer: the start's empty input ({}) is not a piece
// before the input's own (which would stream {}{"a":1}), and a call whose
// whole input came in its start, empty or not, streams that input once.
func TestAnAnthropicToolCallsStreamedArgumentsAreItsInput(t *testing.T) {
	acc := newAnthropicStreamAcc()
	streamed := map[int]string{}
	for _, ev := range []string{
		`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"1}"}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t2","name":"g","input":{"k":"v"}}}`,
		`{"type":"content_block_stop","index":1}`,
		`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t3","name":"h","input":{}}}`,
		`{"type":"content_block_stop","index":2}`,
		`{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}`,
		`{"type":"message_stop"}`,
	} {
		if _, _, err := acc.event("", []byte(ev)); err != nil {
			t.Fatal(err)
		}
		for _, c := range acc.takeChunk().ToolCalls {
			streamed[c.Index] += c.Arguments
		}
	}
	var calls []struct {
		Function struct{ Arguments string } `json:"function"`
	}
	if err := json.Unmarshal(acc.response().ToolCalls, &calls); err != nil || len(calls) != 3 {
		t.Fatalf("tool calls %s: %v", acc.response().ToolCalls, err)
	}
	for i, c := range calls {
		if streamed[i] != c.Function.Arguments {
			t.Fatalf("call %d streamed %q, its arguments are %q", i, streamed[i], c.Function.Arguments)
		}
	}
	if calls[0].Function.Arguments != `{"a":1}` || calls[1].Function.Arguments != `{"k":"v"}` || calls[2].Function.Arguments != "{}" {
		t.Fatalf("arguments %+v", calls)
	}
}
