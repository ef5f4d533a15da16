package messages

import (
	"encoding/json"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
)

var who = answer.Identity{ID: "act-1", Model: "claude"}

func TestRenderMessage(t *testing.T) {
	cases := []struct {
		name string
		r    *providers.Response
		want string
	}{
		{
			name: "text",
			r:    &providers.Response{Text: "Hello!", FinishReason: "stop", Usage: providers.Usage{PromptTokens: 10, CompletionTokens: 3, TotalTokens: 13}},
			want: `{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Hello!"}],
				"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":3}}`,
		},
		{
			name: "text and tool calls; arguments that are no object kept as text",
			r: &providers.Response{Text: "Checking.", FinishReason: "tool_calls", ToolCalls: json.RawMessage(`[
				{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"SF\"}"}},
				{"id":"call_2","type":"function","function":{"name":"now","arguments":""}},
				{"id":"call_3","type":"function","function":{"name":"odd","arguments":"not json"}}]`)},
			want: `{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Checking."},
				{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"SF"}},
				{"type":"tool_use","id":"call_2","name":"now","input":{}},
				{"type":"tool_use","id":"call_3","name":"odd","input":"not json"}],
				"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "tool calls whose finish reason says only stop",
			r:    &providers.Response{FinishReason: "stop", ToolCalls: json.RawMessage(`[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`)},
			want: `{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[{"type":"tool_use","id":"c","name":"f","input":{}}],
				"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "a refusal",
			r:    &providers.Response{Refusal: "I can't help with that.", FinishReason: "content_filter"},
			want: `{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"I can't help with that."}],
				"stop_reason":"refusal","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "a partial answer is cut: max_tokens, and its raw body is not used",
			r:    &providers.Response{Text: "Hel", FinishReason: "stop", Partial: true, Incomplete: "idle_timeout", Raw: json.RawMessage(`{"type":"message","content":[]}`)},
			want: `{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Hel"}],
				"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "no answer at all",
			r:    nil,
			want: `{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[],
				"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}`,
		},
		{
			name: "an Anthropic route's own body passes with every member, id and model replaced",
			r: &providers.Response{Text: "Hi", FinishReason: "stop", Raw: json.RawMessage(`{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5",
				"content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Hi <b>"}],"stop_reason":"stop_sequence","stop_sequence":"END",
				"usage":{"input_tokens":5,"cache_read_input_tokens":100,"output_tokens":2}}`)},
			want: `{"content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Hi <b>"}],"id":"act-1","model":"claude","role":"assistant",
				"stop_reason":"stop_sequence","stop_sequence":"END","type":"message","usage":{"input_tokens":5,"cache_read_input_tokens":100,"output_tokens":2}}`,
		},
		{
			name: "an OpenAI route's own body is not a Messages response: built from the envelope",
			r:    &providers.Response{Text: "Hi", FinishReason: "length", Raw: json.RawMessage(`{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`)},
			want: `{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Hi"}],
				"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := RenderMessage(who, tc.r)
			if string(got) != compact(t, tc.want)+"\n" {
				t.Fatalf("got  %s\nwant %s", got, compact(t, tc.want))
			}
		})
	}
}

func TestStopReason(t *testing.T) {
	calls := json.RawMessage(`[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`)
	for _, tc := range []struct {
		r    providers.Response
		want string
	}{
		{providers.Response{FinishReason: "stop"}, "end_turn"},
		{providers.Response{FinishReason: "length"}, "max_tokens"},
		{providers.Response{FinishReason: "tool_calls", ToolCalls: calls}, "tool_use"},
		{providers.Response{FinishReason: "function_call", ToolCalls: calls}, "tool_use"},
		{providers.Response{FinishReason: "content_filter"}, "refusal"},
		{providers.Response{FinishReason: "pause_turn"}, "pause_turn"},
		{providers.Response{FinishReason: "eos"}, "end_turn"},
		{providers.Response{}, "end_turn"},
		{providers.Response{ToolCalls: calls}, "tool_use"},
		{providers.Response{FinishReason: "stop", ToolCalls: calls}, "tool_use"},
		{providers.Response{FinishReason: "length", ToolCalls: calls}, "max_tokens"},
		{providers.Response{FinishReason: "stop", Partial: true}, "max_tokens"},
	} {
		if got := StopReason(&tc.r); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.r, got, tc.want)
		}
	}
}
