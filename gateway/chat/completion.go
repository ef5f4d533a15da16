package chat

import (
	"encoding/json"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
)

// wire shapes of chat.completion and chat.completion.chunk, as OpenAI
// sends them.
type (
	wireUsage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
	wireFunction struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
	wireToolCall struct {
		Index    *int         `json:"index,omitempty"`
		ID       string       `json:"id,omitempty"`
		Type     string       `json:"type,omitempty"`
		Function wireFunction `json:"function"`
	}
	wireMessage struct {
		Role      string          `json:"role"`
		Content   *string         `json:"content"`
		Refusal   *string         `json:"refusal"`
		ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
	}
	wireChoice struct {
		Index        int         `json:"index"`
		Message      wireMessage `json:"message"`
		FinishReason string      `json:"finish_reason"`
		Logprobs     *struct{}   `json:"logprobs"`
	}
	wireCompletion struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []wireChoice `json:"choices"`
		// Usage is nil when the provider reported none.
		Usage *wireUsage `json:"usage,omitempty"`
	}
	wireDelta struct {
		Role      string         `json:"role,omitempty"`
		Content   *string        `json:"content,omitempty"`
		Refusal   *string        `json:"refusal,omitempty"`
		ToolCalls []wireToolCall `json:"tool_calls,omitempty"`
	}
	wireChunkChoice struct {
		Index        int       `json:"index"`
		Delta        wireDelta `json:"delta"`
		FinishReason *string   `json:"finish_reason"`
	}
	wireChunk struct {
		ID      string            `json:"id"`
		Object  string            `json:"object"`
		Created int64             `json:"created"`
		Model   string            `json:"model"`
		Choices []wireChunkChoice `json:"choices"`
		Usage   *wireUsage        `json:"usage,omitempty"`
	}
)

func usageOf(u providers.Usage) wireUsage {
	return wireUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
}

func strOrNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// finishReasonOf is the answer's finish reason: "length" for a partial
// answer (it was cut), else the provider's, else "tool_calls" or "stop".
func finishReasonOf(r *providers.Response) string {
	switch {
	case r.Partial:
		return "length"
	case r.FinishReason != "":
		return r.FinishReason
	case len(r.ToolCalls) > 0 && string(r.ToolCalls) != "null" && string(r.ToolCalls) != "[]":
		return "tool_calls"
	}
	return "stop"
}

// completionJSON renders an answer as a chat.completion. The provider's
// own body, when the action kept it, is passed on with every member it
// had (system_fingerprint, logprobs, ...), with id, model and created
// replaced; otherwise the body is built from the response. A partial
// answer's finish_reason is "length".
func completionJSON(who answer.Identity, r *providers.Response) []byte {
	if b, ok := answer.ProviderBody(r, isCompletion, map[string]any{
		"id": who.ID, "model": who.Model, "created": who.Created, "object": "chat.completion"}); ok {
		return b
	}
	c := wireCompletion{
		ID: who.ID, Object: "chat.completion", Created: who.Created, Model: who.Model,
		Choices: []wireChoice{{Message: wireMessage{Role: "assistant", Content: strOrNull(r.Text), Refusal: strOrNull(r.Refusal)}, FinishReason: finishReasonOf(r)}},
	}
	if r.Usage != (providers.Usage{}) {
		u := usageOf(r.Usage)
		c.Usage = &u
	}
	if len(r.ToolCalls) > 0 && string(r.ToolCalls) != "null" {
		c.Choices[0].Message.ToolCalls = r.ToolCalls
	}
	b, _ := json.Marshal(c) // only marshallable values
	return append(b, '\n')
}

// isCompletion reports a provider body that is a chat completion: one
// with choices.
func isCompletion(m map[string]json.RawMessage) bool {
	var choices []json.RawMessage
	return json.Unmarshal(m["choices"], &choices) == nil && len(choices) > 0
}
