package messages

import (
	"encoding/json"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// The Messages wire shapes, members in the order Anthropic sends them.
type (
	wireMessage struct {
		ID           string            `json:"id"`
		Type         string            `json:"type"`
		Role         string            `json:"role"`
		Model        string            `json:"model"`
		Content      []json.RawMessage `json:"content"`
		StopReason   *string           `json:"stop_reason"`
		StopSequence *string           `json:"stop_sequence"`
		Usage        wireUsage         `json:"usage"`
	}
	wireUsage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	wireText struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	wireToolUse struct {
		Type  string          `json:"type"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
)

// RenderMessage renders an answer as a Messages response (type
// "message"): its id is the action id, its model the one the request
// named. When the action kept the provider's own body and it is a Messages
// response (the route was Anthropic's), it is passed on with every member
// it had (stop_sequence, cache usage, thinking blocks, ...), its id and
// model replaced. Otherwise it is built from the envelope: a text block
// with the text (or the refusal), then a tool_use block per tool call, its
// input the call's arguments as an object (arguments that are not a JSON
// object stay as their text, a JSON string, so nothing the model produced
// is lost); stop_reason from the finish reason (StopReason); usage with
// the prompt and completion tokens. A partial answer's stop_reason is
// max_tokens (it was cut), and the gateway marks it x-durallm-incomplete.
func RenderMessage(who answer.Identity, r *providers.Response) []byte {
	if r == nil {
		r = &providers.Response{}
	}
	if b, ok := answer.ProviderBody(r, isMessage, map[string]any{"id": who.ID, "model": who.Model}); ok {
		return b
	}
	stop := StopReason(r)
	m := wireMessage{ID: who.ID, Type: "message", Role: "assistant", Model: who.Model, StopReason: &stop,
		Content: contentBlocks(r), Usage: wireUsage{InputTokens: r.Usage.PromptTokens, OutputTokens: r.Usage.CompletionTokens}}
	b, _ := json.Marshal(m) // only marshallable values
	return append(b, '\n')
}

// isMessage reports a provider body that is a Messages response: of type
// message, with its content.
func isMessage(m map[string]json.RawMessage) bool {
	var typ string
	var content []json.RawMessage
	return json.Unmarshal(m["type"], &typ) == nil && typ == "message" && json.Unmarshal(m["content"], &content) == nil && content != nil
}

// contentBlocks are r's text and tool calls as Messages content blocks.
func contentBlocks(r *providers.Response) []json.RawMessage {
	out := []json.RawMessage{}
	for _, t := range []string{r.Text, r.Refusal} {
		if t != "" {
			b, _ := json.Marshal(wireText{Type: "text", Text: t})
			out = append(out, b)
		}
	}
	for _, c := range exchange.WholeChunk(*r).ToolCalls {
		b, _ := json.Marshal(wireToolUse{Type: "tool_use", ID: c.ID, Name: c.Name, Input: toolInput(c.Arguments)})
		out = append(out, b)
	}
	return out
}

// toolInput is a tool call's arguments as a tool_use input: the object
// they encode, or their text when they encode none.
func toolInput(arguments string) json.RawMessage {
	if in, ok := exchange.AnthropicToolInput(json.RawMessage(arguments)); ok {
		return in
	}
	b, _ := json.Marshal(arguments)
	return b
}

// StopReason is the stop_reason of an answer: max_tokens for a partial one
// (it was cut); else the finish reason mapped back (stop is end_turn,
// length max_tokens, tool_calls tool_use, content_filter refusal), except
// that an answer with tool calls whose finish reason says only that it
// stopped is tool_use, which is what an Anthropic client runs tools on;
// with no finish reason, tool_use or end_turn.
func StopReason(r *providers.Response) string {
	if r.Partial {
		return "max_tokens"
	}
	calls := len(exchange.WholeChunk(*r).ToolCalls) > 0
	stop, ok := exchange.AnthropicStopReason(r.FinishReason)
	switch {
	case calls && (!ok || stop == "end_turn"):
		return "tool_use"
	case ok:
		return stop
	}
	return "end_turn"
}
