package exchange

import (
	"encoding/json"
	"testing"
)

// Both directions of the Messages dialect read one table: every
// stop_reason maps to a finish_reason and back to a stop_reason that maps
// to the same finish_reason.
func TestAnthropicStopReasonsBothWays(t *testing.T) {
	cases := []struct {
		finish, stop string
		ok           bool
	}{
		{"stop", "end_turn", true},
		{"length", "max_tokens", true},
		{"tool_calls", "tool_use", true},
		{"function_call", "tool_use", true},
		{"content_filter", "refusal", true},
		{"end_turn", "end_turn", true},
		{"stop_sequence", "stop_sequence", true},
		{"model_context_window_exceeded", "model_context_window_exceeded", true},
		{"pause_turn", "pause_turn", true},
		{"", "", false},
		{"eos", "", false},
	}
	for _, tc := range cases {
		stop, ok := AnthropicStopReason(tc.finish)
		if stop != tc.stop || ok != tc.ok {
			t.Errorf("AnthropicStopReason(%q) = %q, %v; want %q, %v", tc.finish, stop, ok, tc.stop, tc.ok)
		}
	}
	for _, p := range stopReasons {
		back, ok := AnthropicStopReason(AnthropicFinishReason(p.anthropic))
		if !ok || AnthropicFinishReason(back) != AnthropicFinishReason(p.anthropic) {
			t.Errorf("%s: back as %q (%v)", p.anthropic, back, ok)
		}
	}
	if got := AnthropicFinishReason("pause_turn"); got != "pause_turn" {
		t.Errorf("an unknown stop_reason became %q", got)
	}
}

func TestToolChoiceModesBothWays(t *testing.T) {
	for _, m := range []struct{ openai, anthropic string }{{"auto", "auto"}, {"none", "none"}, {"required", "any"}} {
		if a, ok := AnthropicToolChoice(m.openai); !ok || a != m.anthropic {
			t.Errorf("AnthropicToolChoice(%q) = %q, %v", m.openai, a, ok)
		}
		if o, ok := OpenAIToolChoice(m.anthropic); !ok || o != m.openai {
			t.Errorf("OpenAIToolChoice(%q) = %q, %v", m.anthropic, o, ok)
		}
	}
	if _, ok := AnthropicToolChoice("tool"); ok {
		t.Error("tool is no OpenAI tool_choice string")
	}
	if _, ok := OpenAIToolChoice("required"); ok {
		t.Error("required is no Anthropic tool_choice type")
	}
}

// A tool_use input and OpenAI arguments are each other's: arguments read
// as an input and rendered back give the same compact JSON.
func TestAnthropicToolInputAndCallsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		arguments string
		input     string
		ok        bool
	}{
		{`"{\"city\": \"SF\"}"`, `{"city":"SF"}`, true},
		{`{"city":"SF"}`, `{"city":"SF"}`, true},
		{`""`, `{}`, true},
		{`null`, `{}`, true},
		{`"[1,2]"`, ``, false},
		{`"{\"cut\":"`, ``, false},
	} {
		in, ok := AnthropicToolInput(json.RawMessage(tc.arguments))
		if ok != tc.ok || string(in) != tc.input {
			t.Errorf("AnthropicToolInput(%s) = %s, %v", tc.arguments, in, ok)
			continue
		}
		if !ok {
			continue
		}
		blocks := `[{"type":"text","text":"x"},{"type":"tool_use","id":"t","name":"f","input":` + string(in) + `}]`
		want := `[{"id":"t","type":"function","function":{"name":"f","arguments":` + string(mustJSON(string(in))) + `}}]`
		if got := string(AnthropicToolCalls(json.RawMessage(blocks))); got != want {
			t.Errorf("AnthropicToolCalls = %s, want %s", got, want)
		}
	}
	if AnthropicToolCalls(json.RawMessage(`[{"type":"text","text":"x"}]`)) != nil {
		t.Error("tool calls from text only")
	}
}

func mustJSON(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}
