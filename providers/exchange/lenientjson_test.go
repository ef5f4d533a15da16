package exchange

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/durallm/durallm/providers"

	"github.com/durallm/durallm/evidence"
)

// Recorded and drifted chat-completions bodies: what real OpenAI-compatible
// providers and gateways have sent, trimmed to the members that matter.
func TestParseCompletionDriftedShapes(t *testing.T) {
	cases := []struct {
		name       string
		body       string
		wantText   string
		wantRef    string
		wantTools  string // compacted JSON, "" for none
		wantFinish string
		wantUsage  providers.Usage
		wantID     string
		wantModel  string
		wantStatus string
		wantSig    evidence.Signal
		wantErr    error
		keepRaw    string // a member that must survive in Raw
	}{
		{
			name:       "openai canonical",
			body:       `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`,
			wantText:   "Hello.",
			wantFinish: "stop",
			wantUsage:  providers.Usage{PromptTokens: 9, CompletionTokens: 2, TotalTokens: 11},
			wantID:     "chatcmpl-1",
			wantModel:  "gpt-4o",
		},
		{
			name:       "extra members everywhere",
			body:       `{"id":"x","model":"m","system_fingerprint":"fp_1","service_tier":"default","choices":[{"index":0,"message":{"role":"assistant","content":"hi","annotations":[],"audio":null,"reasoning_content":"thinking"},"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}},"x_groq":{"id":"req_1"}}`,
			wantText:   "hi",
			wantFinish: "stop",
			wantUsage:  providers.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2},
			wantID:     "x",
			wantModel:  "m",
			keepRaw:    `"x_groq"`,
		},
		{
			name:       "cached prompt tokens",
			body:       `{"choices":[{"message":{"content":"c"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`,
			wantText:   "c",
			wantFinish: "stop",
			wantUsage:  providers.Usage{PromptTokens: 2006, CompletionTokens: 300, TotalTokens: 2306, CachedTokens: 1920},
		},
		{
			name:     "missing optional members",
			body:     `{"choices":[{"message":{"content":"bare"}}]}`,
			wantText: "bare",
		},
		{
			name:      "numbers as strings and floats",
			body:      `{"choices":[{"index":"0","message":{"content":"n"},"finish_reason":"length"}],"usage":{"prompt_tokens":"12","completion_tokens":3.0,"total_tokens":" 15 "}}`,
			wantText:  "n",
			wantUsage: providers.Usage{PromptTokens: 12, CompletionTokens: 3, TotalTokens: 15},
			// finish_reason kept as sent
			wantFinish: "length",
		},
		{
			name:      "usage without total, responses-style names",
			body:      `{"choices":[{"message":{"content":"u"}}],"usage":{"input_tokens":4,"output_tokens":5}}`,
			wantText:  "u",
			wantUsage: providers.Usage{PromptTokens: 4, CompletionTokens: 5, TotalTokens: 9},
		},
		{
			name:      "null arrays and null usage",
			body:      `{"id":"n","choices":[{"index":0,"message":{"role":"assistant","content":"ok","tool_calls":null},"finish_reason":"stop"}],"usage":null}`,
			wantText:  "ok",
			wantID:    "n",
			wantUsage: providers.Usage{},
			// tool_calls null: none
			wantFinish: "stop",
		},
		{
			name:     "content as an array of parts",
			body:     `{"choices":[{"message":{"content":[{"type":"text","text":"one "},{"type":"image_url","image_url":{}},"two"]}}]}`,
			wantText: "one two",
		},
		{
			name:       "tool calls only, content null",
			body:       `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}]}`,
			wantTools:  `[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]`,
			wantFinish: "tool_calls",
		},
		{
			name:      "legacy function_call",
			body:      `{"choices":[{"message":{"content":null,"function_call":{"name":"g","arguments":"{}"}}}]}`,
			wantTools: `[{"type":"function","function":{"name":"g","arguments":"{}"}}]`,
		},
		{
			name:       "refusal only",
			body:       `{"choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}`,
			wantRef:    "I can't help with that.",
			wantFinish: "stop",
		},
		{
			name:     "second choice ignored, index order respected",
			body:     `{"choices":[{"index":1,"message":{"content":"second"}},{"index":0,"message":{"content":"first"}}]}`,
			wantText: "first",
		},
		{
			name:     "legacy completions text",
			body:     `{"choices":[{"text":"legacy","index":0}]}`,
			wantText: "legacy",
		},
		{
			name:     "message missing, delta present",
			body:     `{"choices":[{"delta":{"content":"wrapped"}}]}`,
			wantText: "wrapped",
		},
		// Empty-response detection.
		{name: "zero-length body", body: ``, wantSig: evidence.SignalEmptyResponse},
		{name: "whitespace body", body: " \n\t", wantSig: evidence.SignalEmptyResponse},
		{name: "empty object", body: `{}`, wantSig: evidence.SignalEmptyResponse},
		{name: "choices empty", body: `{"id":"e","choices":[]}`, wantSig: evidence.SignalEmptyResponse, wantID: "e"},
		{name: "choices null", body: `{"choices":null}`, wantSig: evidence.SignalEmptyResponse},
		{name: "choices not an array", body: `{"choices":"nope"}`, wantSig: evidence.SignalEmptyResponse},
		{name: "content empty string", body: `{"choices":[{"message":{"role":"assistant","content":""},"finish_reason":"stop"}]}`, wantSig: evidence.SignalEmptyResponse, wantFinish: "stop"},
		{name: "content null, no tools", body: `{"choices":[{"message":{"role":"assistant","content":null}}]}`, wantSig: evidence.SignalEmptyResponse},
		{name: "tool_calls empty array", body: `{"choices":[{"message":{"content":null,"tool_calls":[]}}]}`, wantSig: evidence.SignalEmptyResponse},
		{name: "top-level array", body: `[1,2]`, wantSig: evidence.SignalEmptyResponse},
		{name: "top-level string", body: `"hello"`, wantSig: evidence.SignalEmptyResponse},
		{
			name:       "filtered to nothing",
			body:       `{"choices":[{"message":{"content":null},"finish_reason":"content_filter"}]}`,
			wantSig:    evidence.SignalContentFiltered,
			wantFinish: "content_filter",
		},
		{
			// TestInProgressChatCompletionIsEmpty has the rest.
			name:       "in_progress with nothing is empty",
			body:       `{"id":"resp_1","object":"response","status":"in_progress","output":[]}`,
			wantID:     "resp_1",
			wantStatus: "in_progress",
			wantSig:    evidence.SignalEmptyResponse,
			keepRaw:    `"output":[]`,
		},
		{
			name:       "responses-style completed with nothing is empty",
			body:       `{"id":"resp_3","object":"response","status":"completed","output":[]}`,
			wantID:     "resp_3",
			wantStatus: "completed",
			wantSig:    evidence.SignalEmptyResponse,
		},
		{
			name:    "a 200 carrying an overload error",
			body:    `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			wantSig: evidence.SignalOverloaded,
		},
		{
			name:    "a 200 carrying an unknown error",
			body:    `{"error":{"message":"something"}}`,
			wantSig: evidence.SignalEmptyResponse,
		},
		// Unreadable.
		{name: "not JSON", body: `<html>502 Bad Gateway</html>`, wantSig: evidence.SignalEmptyResponse, wantErr: ErrMalformedResponse},
		// A cut, not garbage (TestTruncatedJSONBodyIsACut).
		{name: "truncated JSON", body: `{"choices":[{"message":{"content":"cut`, wantSig: evidence.SignalStreamIncomplete, wantErr: ErrTruncatedBody},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, sig, err := parseCompletion([]byte(tc.body))
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if sig != tc.wantSig {
				t.Errorf("signal = %q, want %q", sig, tc.wantSig)
			}
			if r.Text != tc.wantText || r.Refusal != tc.wantRef || r.FinishReason != tc.wantFinish {
				t.Errorf("text/refusal/finish = %q/%q/%q, want %q/%q/%q", r.Text, r.Refusal, r.FinishReason, tc.wantText, tc.wantRef, tc.wantFinish)
			}
			want := ""
			if tc.wantTools != "" {
				want = compact(t, json.RawMessage(tc.wantTools))
			}
			if got := compact(t, r.ToolCalls); got != want {
				t.Errorf("tool_calls = %s, want %s", got, tc.wantTools)
			}
			if r.Usage != tc.wantUsage {
				t.Errorf("usage = %+v, want %+v", r.Usage, tc.wantUsage)
			}
			if r.ID != tc.wantID || r.Model != tc.wantModel || r.Status != tc.wantStatus {
				t.Errorf("id/model/status = %q/%q/%q, want %q/%q/%q", r.ID, r.Model, r.Status, tc.wantID, tc.wantModel, tc.wantStatus)
			}
			if tc.keepRaw != "" && !strings.Contains(string(r.Raw), tc.keepRaw) {
				t.Errorf("Raw lost %s: %s", tc.keepRaw, r.Raw)
			}
			if tc.wantErr == nil && strings.TrimSpace(tc.body) != "" && string(r.Raw) != strings.TrimSpace(tc.body) {
				t.Errorf("Raw is not the whole body: %s", r.Raw)
			}
		})
	}
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	if raw == nil {
		return ""
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("invalid JSON %s: %v", raw, err)
	}
	// Re-marshalled, members come out sorted, so two spellings of the same
	// JSON compare equal.
	b, _ := json.Marshal(v)
	return string(b)
}

func TestParseCompletionErrorNeverQuotesTheBody(t *testing.T) {
	const canary = "CANARY-output-8d1f"
	_, _, err := parseCompletion([]byte(`{"choices":[{"message":{"content":"` + canary + `"}}]} trailing ` + canary))
	if !errors.Is(err, ErrMalformedResponse) {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), canary) || strings.Contains(err.Error(), "trailing") {
		t.Fatalf("error quotes the body: %v", err)
	}
}

// Error bodies of HTTP error statuses, as providers send them.
func TestErrorBodyMapping(t *testing.T) {
	cases := []struct {
		name     string
		body     string
		want     evidence.Signal
		wantCode string
		wantType string
	}{
		{"openai model_not_found", `{"error":{"message":"The model 'x' does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}`, evidence.SignalModelNotFound, "model_not_found", "invalid_request_error"},
		{"model_not_found as type", `{"error":{"message":"gone","type":"model_not_found"}}`, evidence.SignalModelNotFound, "", "model_not_found"},
		{"context_length_exceeded code", `{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}`, evidence.SignalContextTooLong, "context_length_exceeded", "invalid_request_error"},
		{"context_length_exceeded type", `{"error":{"message":"x","type":"context_length_exceeded"}}`, evidence.SignalContextTooLong, "", "context_length_exceeded"},
		{"maximum context length in message", `{"error":{"message":"This model's Maximum Context Length is 8192 tokens.","type":"invalid_request_error","code":null}}`, evidence.SignalContextTooLong, "", "invalid_request_error"},
		{"anthropic-style overloaded", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, evidence.SignalOverloaded, "", "overloaded_error"},
		{"server_overloaded", `{"error":{"message":"busy","type":"server_overloaded"}}`, evidence.SignalOverloaded, "", "server_overloaded"},
		{"content_filter code", `{"error":{"message":"filtered","type":"invalid_request_error","code":"content_filter"}}`, evidence.SignalContentFiltered, "content_filter", "invalid_request_error"},
		{"content_policy_violation code", `{"error":{"message":"policy","type":"invalid_request_error","code":"content_policy_violation"}}`, evidence.SignalContentFiltered, "content_policy_violation", "invalid_request_error"},
		{"upper-case code", `{"error":{"code":"MODEL_NOT_FOUND"}}`, evidence.SignalModelNotFound, "MODEL_NOT_FOUND", ""},
		{"numeric code", `{"error":{"code":429,"message":"slow down"}}`, evidence.SignalNone, "429", ""},
		{"rate limit", `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, evidence.SignalNone, "rate_limit_exceeded", "requests"},
		{"invalid key", `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`, evidence.SignalNone, "invalid_api_key", "invalid_request_error"},
		{"error as bare string", `{"error":"model_not_found"}`, evidence.SignalNone, "", ""},
		{"top-level error object", `{"code":"model_not_found","message":"no such model"}`, evidence.SignalModelNotFound, "model_not_found", ""},
		{"array of errors", `[{"error":{"code":"context_length_exceeded","message":"long"}}]`, evidence.SignalContextTooLong, "context_length_exceeded", ""},
		{"html", `<html><body>Bad gateway</body></html>`, evidence.SignalNone, "", ""},
		{"empty", ``, evidence.SignalNone, "", ""},
		{"null error", `{"error":null}`, evidence.SignalNone, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, sig := parseErrorBody([]byte(tc.body))
			if sig != tc.want {
				t.Errorf("signal = %q, want %q", sig, tc.want)
			}
			code, typ := "", ""
			if r.Error != nil {
				code, typ = r.Error.Code, r.Error.Type
			}
			if code != tc.wantCode || typ != tc.wantType {
				t.Errorf("code/type = %q/%q, want %q/%q", code, typ, tc.wantCode, tc.wantType)
			}
		})
	}
}

func TestStreamAccumulatesToolCalls(t *testing.T) {
	acc := newStreamAcc()
	events := []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get","arguments":""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"q\":"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"put","arguments":"{}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":"3","completion_tokens":4,"total_tokens":7}}`,
		`[DONE]`,
	}
	firsts := 0
	for i, e := range events {
		_, first, err := acc.event("", []byte(e))
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if first {
			firsts++
			if i != 1 {
				t.Fatalf("content started at event %d, want 1 (the role-only chunk is not content)", i)
			}
		}
	}
	if firsts != 1 {
		t.Fatalf("first content reported %d times", firsts)
	}
	r := acc.response()
	want := `[{"id":"call_a","type":"function","function":{"name":"get","arguments":"{\"q\":1}"}},{"id":"call_b","type":"function","function":{"name":"put","arguments":"{}"}}]`
	if got := compact(t, r.ToolCalls); got != compact(t, json.RawMessage(want)) {
		t.Fatalf("tool calls = %s\nwant %s", got, want)
	}
	if r.FinishReason != "tool_calls" || r.Usage != (providers.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}) || !acc.done || !acc.complete() {
		t.Fatalf("finish %q usage %+v done %v", r.FinishReason, r.Usage, acc.done)
	}
	if streamSignal(r) != evidence.SignalNone {
		t.Fatalf("a tool-call-only stream is usable")
	}
}

func TestStreamEventShapes(t *testing.T) {
	cases := []struct {
		name      string
		data      string
		event     string
		wantText  string
		wantFirst bool
		wantErr   error
	}{
		{name: "role only", data: `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`},
		{name: "content", data: `{"choices":[{"index":0,"delta":{"content":"hi"}}]}`, wantText: "hi", wantFirst: true},
		{name: "refusal commits", data: `{"choices":[{"delta":{"refusal":"no"}}]}`, wantFirst: true},
		{name: "other choice ignored", data: `{"choices":[{"index":2,"delta":{"content":"x"}}]}`},
		{name: "usage chunk", data: `{"choices":null,"usage":{"total_tokens":"5"}}`},
		{name: "bare value", data: `42`},
		{name: "empty data", data: ``},
		{name: "not JSON", data: `{"choices":`, wantErr: ErrMalformedStream},
		{name: "error member", data: `{"error":{"type":"server_error","message":"boom"}}`, wantErr: errProviderError},
		{name: "error event", event: "error", data: `{"type":"overloaded_error","message":"busy"}`, wantErr: errProviderError},
		{name: "content parts", data: `{"choices":[{"delta":{"content":[{"type":"text","text":"p"}]}}]}`, wantText: "p", wantFirst: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			acc := newStreamAcc()
			text, first, err := acc.event(tc.event, []byte(tc.data))
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if text != tc.wantText || first != tc.wantFirst {
				t.Fatalf("text %q first %v, want %q %v", text, first, tc.wantText, tc.wantFirst)
			}
		})
	}
	acc := newStreamAcc()
	_, _, _ = acc.event("error", []byte(`{"type":"overloaded_error","message":"busy"}`))
	if errorSignal(acc.resp.Error) != evidence.SignalOverloaded {
		t.Fatalf("error event type not read: %+v", acc.resp.Error)
	}
}

func TestStreamAccumulatorIsBounded(t *testing.T) {
	acc := newStreamAcc()
	acc.limit = 10
	if _, _, err := acc.event("", []byte(`{"choices":[{"delta":{"content":"12345"}}]}`)); err != nil {
		t.Fatal(err)
	}
	_, _, err := acc.event("", []byte(`{"choices":[{"delta":{"content":"678901"}}]}`))
	if !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("err = %v, want ErrResponseTooLarge", err)
	}
	if got := acc.response().Text; got != "12345" {
		t.Fatalf("text = %q: the rejected event must not be applied", got)
	}
	// Ever-new tool-call indexes cost memory too.
	acc = newStreamAcc()
	acc.limit = 3 * toolCallOverhead
	var last error
	for i := 0; i < 10 && last == nil; i++ {
		_, _, last = acc.event("", []byte(`{"choices":[{"delta":{"tool_calls":[{"index":`+string(rune('0'+i))+`}]}}]}`))
	}
	if !errors.Is(last, ErrResponseTooLarge) {
		t.Fatalf("empty tool calls with new indexes were not bounded: %v", last)
	}
}

// A 2xx body that is a valid JSON prefix was cut, not garbage: the
// provider ran the request, so it is SignalStreamIncomplete (ambiguous
// before content) with ErrTruncatedBody; a body that stops being JSON
// before its end stays malformed (empty_response). Both dialects.
func TestTruncatedJSONBodyIsACut(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		wantSig evidence.Signal
		wantErr error
	}{
		{"cut in a string", `{"choices":[{"message":{"content":"cut`, evidence.SignalStreamIncomplete, ErrTruncatedBody},
		{"cut after a comma", `{"id":"x","choices":[`, evidence.SignalStreamIncomplete, ErrTruncatedBody},
		{"cut in a number", `{"usage":{"total_tokens":12`, evidence.SignalStreamIncomplete, ErrTruncatedBody},
		{"cut in a literal", `{"refusal":nu`, evidence.SignalStreamIncomplete, ErrTruncatedBody},
		{"only the opening brace", " {\n", evidence.SignalStreamIncomplete, ErrTruncatedBody},
		{"cut in a multi-byte character", "{\"content\":\"caf\xc3", evidence.SignalStreamIncomplete, ErrTruncatedBody},
		// Not JSON, whatever its length.
		{"html", `<html>502 Bad Gateway</html>`, evidence.SignalEmptyResponse, ErrMalformedResponse},
		{"plain text", `upstream connect error`, evidence.SignalEmptyResponse, ErrMalformedResponse},
		{"bad character as the last byte", `{"a":1x`, evidence.SignalEmptyResponse, ErrMalformedResponse},
		{"garbage after a complete value", `{"a":1} trailing`, evidence.SignalEmptyResponse, ErrMalformedResponse},
	}
	for _, p := range []struct {
		name  string
		parse func([]byte) (providers.Response, evidence.Signal, error)
	}{{"openai", parseCompletion}, {"anthropic", parseAnthropicMessage}} {
		for _, tc := range cases {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				r, sig, err := p.parse([]byte(tc.body))
				if sig != tc.wantSig || !errors.Is(err, tc.wantErr) {
					t.Fatalf("signal %q err %v, want %q and %v", sig, err, tc.wantSig, tc.wantErr)
				}
				if other := map[error]error{ErrTruncatedBody: ErrMalformedResponse, ErrMalformedResponse: ErrTruncatedBody}[tc.wantErr]; errors.Is(err, other) {
					t.Fatalf("err %v is both truncated and malformed", err)
				}
				if r.Raw != nil {
					t.Fatalf("Raw kept an unreadable body: %s", r.Raw)
				}
			})
		}
	}
}

// A chat completion marked in_progress or queued with no content is an
// empty response, never a silent completed: no adapter makes the
// background (Responses-API) calls whose answer comes later, so nothing
// will ever fetch it.
func TestInProgressChatCompletionIsEmpty(t *testing.T) {
	for _, body := range []string{
		`{"id":"chatcmpl-1","object":"chat.completion","status":"in_progress","choices":[]}`,
		`{"id":"chatcmpl-2","object":"chat.completion","status":"queued"}`,
		`{"id":"resp_1","object":"response","status":"in_progress","output":[]}`,
		`{"id":"chatcmpl-3","status":"queued","choices":[{"index":0,"message":{"role":"assistant","content":null}}]}`,
	} {
		r, sig, err := parseCompletion([]byte(body))
		if err != nil || sig != evidence.SignalEmptyResponse {
			t.Errorf("%s: signal %q err %v, want %q", body, sig, err, evidence.SignalEmptyResponse)
		}
		if r.Status == "" {
			t.Errorf("%s: status not kept", body)
		}
	}
	// Content still wins, whatever the status says.
	if _, sig, _ := parseCompletion([]byte(`{"status":"in_progress","choices":[{"message":{"content":"hi"}}]}`)); sig != evidence.SignalNone {
		t.Errorf("content with a status: signal %q", sig)
	}
}

// A ChunkSink gets each event's typed pieces after the commit: the
// tool-call deltas with the call's position as its index (whatever the
// provider numbered it), the finish reason, and usage as the running total;
// the role-only chunk before the content gives nothing.
func TestStreamChunksForAChunkSink(t *testing.T) {
	acc := newStreamAcc()
	events := []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`,
		`{"choices":[{"index":0,"delta":{"refusal":"no"}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":5,"id":"call_a","type":"function","function":{"name":"get","arguments":""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":5,"function":{"arguments":"{}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`,
		`[DONE]`,
	}
	var got []Chunk
	for i, e := range events {
		if _, _, err := acc.event("", []byte(e)); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if c := acc.takeChunk(); !c.Empty() {
			got = append(got, c)
		}
	}
	u := providers.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}
	want := []Chunk{
		{Text: "Hi"},
		{Refusal: "no"},
		{ToolCalls: []ToolCallDelta{{Index: 0, ID: "call_a", Type: "function", Name: "get"}}},
		{ToolCalls: []ToolCallDelta{{Index: 0, Arguments: "{}"}}},
		{FinishReason: "tool_calls"},
		{Usage: &u},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d chunks %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Text != w.Text || g.Refusal != w.Refusal || g.FinishReason != w.FinishReason || fmt.Sprint(g.ToolCalls) != fmt.Sprint(w.ToolCalls) ||
			(g.Usage == nil) != (w.Usage == nil) || (g.Usage != nil && *g.Usage != *w.Usage) {
			t.Fatalf("chunk %d = %+v, want %+v", i, g, w)
		}
	}
}

// Before the first content nothing reaches a ChunkSink, not even usage.
func TestStreamChunksNothingBeforeTheCommit(t *testing.T) {
	acc := newAnthropicStreamAcc()
	if _, _, err := acc.event("message_start", []byte(`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":5}}}`)); err != nil {
		t.Fatal(err)
	}
	if c := acc.takeChunk(); !c.Empty() {
		t.Fatalf("a chunk before the commit: %+v", c)
	}
}
