package exchange

import (
	"bytes"
	"encoding/json"
)

// What the two directions of the Messages dialect share: this package's
// adapter (an envelope request into a Messages request, a Messages answer
// into the envelope) and the Messages front door, package gateway/messages
// (a Messages request into the envelope, an envelope answer into a
// Messages answer). One table or function serves both, so the two
// translations cannot drift apart.

// stopReasons pairs Anthropic's stop_reason values with OpenAI's
// finish_reason. Read left to right it is many to one; the first pair
// naming a finish reason is its way back.
var stopReasons = [...]struct{ anthropic, openai string }{
	{"end_turn", "stop"},
	{"stop_sequence", "stop"},
	{"max_tokens", "length"},
	{"model_context_window_exceeded", "length"},
	{"tool_use", "tool_calls"},
	{"refusal", "content_filter"},
}

// AnthropicFinishReason maps a stop_reason to OpenAI's finish_reason; an
// unknown one (pause_turn) is kept verbatim rather than guessed.
func AnthropicFinishReason(stop string) string {
	for _, p := range stopReasons {
		if p.anthropic == stop {
			return p.openai
		}
	}
	return stop
}

// AnthropicStopReason maps a finish_reason back to a stop_reason: stop is
// end_turn, length max_tokens, tool_calls (and the legacy function_call)
// tool_use, content_filter refusal, and a stop_reason that
// AnthropicFinishReason kept verbatim (pause_turn) is itself. ok is false
// for anything else.
func AnthropicStopReason(finish string) (stop string, ok bool) {
	if finish == "function_call" {
		finish = "tool_calls"
	}
	for _, p := range stopReasons {
		if p.openai == finish {
			return p.anthropic, true
		}
	}
	for _, p := range stopReasons {
		if p.anthropic == finish {
			return finish, true
		}
	}
	if finish == "pause_turn" {
		return finish, true
	}
	return "", false
}

// toolChoiceModes pairs OpenAI's tool_choice strings with Anthropic's
// tool_choice types; a named function is Anthropic's "tool".
var toolChoiceModes = [...]struct{ openai, anthropic string }{
	{"auto", "auto"},
	{"none", "none"},
	{"required", "any"},
}

// AnthropicToolChoice is the tool_choice type for OpenAI's tool_choice
// string (auto, none, required); ok is false for any other.
func AnthropicToolChoice(openai string) (string, bool) {
	for _, m := range toolChoiceModes {
		if m.openai == openai {
			return m.anthropic, true
		}
	}
	return "", false
}

// OpenAIToolChoice is OpenAI's tool_choice string for an Anthropic
// tool_choice type (auto, none, any); ok is false for any other ("tool"
// names a function, which is an object in OpenAI's shape).
func OpenAIToolChoice(anthropic string) (string, bool) {
	for _, m := range toolChoiceModes {
		if m.anthropic == anthropic {
			return m.openai, true
		}
	}
	return "", false
}

// AnthropicToolCalls reads a Messages content array's tool_use blocks
// (an answer's, or an assistant turn's in a request) as OpenAI-shaped
// tool calls, [{"id", "type": "function", "function": {"name",
// "arguments"}}], nil when there are none; each input becomes compact
// arguments text ("{}" when absent). (An answer's text is contentText's:
// text blocks are the only Messages blocks with a "text" member.) Server-tool
// blocks are Anthropic's own work, not calls for the caller to make, and
// stay in Response.Raw with thinking and unknown blocks.
func AnthropicToolCalls(content json.RawMessage) json.RawMessage {
	var calls []toolCall
	for _, el := range arr(content) {
		var b wireAnthropicBlock
		if obj(el, &b) && str(b.Type) == "tool_use" {
			calls = append(calls, toolCall{ID: str(b.ID), Type: "function", Name: str(b.Name), Arguments: toolArgs(b.Input)})
		}
	}
	if len(calls) == 0 {
		return nil
	}
	return toolCallsJSON(calls)
}

// AnthropicToolInput reads OpenAI function arguments (a JSON-encoded
// string, or the object itself from some compatible providers) as a
// tool_use input, a compact JSON object. Empty arguments are the empty
// object; ok is false for arguments that are not an object.
func AnthropicToolInput(raw json.RawMessage) (json.RawMessage, bool) {
	tr := bytes.TrimSpace(raw)
	if isNull(tr) {
		return json.RawMessage(`{}`), true
	}
	if tr[0] == '"' {
		tr = bytes.TrimSpace([]byte(str(tr)))
		if len(tr) == 0 {
			return json.RawMessage(`{}`), true
		}
	}
	if tr[0] != '{' || !json.Valid(tr) {
		return nil, false
	}
	var b bytes.Buffer
	if json.Compact(&b, tr) != nil {
		return nil, false
	}
	return b.Bytes(), true
}
