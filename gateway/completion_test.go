package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

var who = answerIdentity{ID: "gw-abc", Created: 1700000000, Model: "demo"}

// The provider's own body passes with every member it had, under the
// gateway's id, model and created; the same answer renders the same bytes.
func TestCompletionJSONKeepsTheProvidersBody(t *testing.T) {
	r := &providers.Response{Text: "hi", Raw: json.RawMessage(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-x",
		"system_fingerprint":"fp_1","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":"stop"}],
		"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)}
	b := completionJSON(who, r)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["id"] != "gw-abc" || m["model"] != "demo" || m["created"] != float64(1700000000) || m["system_fingerprint"] != "fp_1" {
		t.Fatalf("%s", b)
	}
	if string(completionJSON(who, r)) != string(b) {
		t.Fatal("two renderings differ")
	}
}

func TestCompletionJSONFromTheResponse(t *testing.T) {
	r := &providers.Response{ToolCalls: json.RawMessage(`[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]`),
		Usage: providers.Usage{PromptTokens: 2, CompletionTokens: 3, TotalTokens: 5}}
	var c struct {
		Choices []struct {
			Message struct {
				Content   *string           `json:"content"`
				ToolCalls []json.RawMessage `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage wireUsage `json:"usage"`
	}
	if err := json.Unmarshal(completionJSON(who, r), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 1 || c.Choices[0].Message.Content != nil || len(c.Choices[0].Message.ToolCalls) != 1 || c.Choices[0].FinishReason != "tool_calls" || c.Usage.TotalTokens != 5 {
		t.Fatalf("%+v", c)
	}
}

// The chunker renders hub events as chunks (the role on the first, the
// finish reason once), keeps usage for the end, and completes a stream from
// the result with what the events did not carry.
func TestChunkerRendersEventsAndCompletesFromTheResult(t *testing.T) {
	ch := &chunker{who: who, includeUsage: true}
	var out []string
	add := func(ev activities.StreamEvent) {
		if b, ok := ch.chunk(ev); ok {
			out = append(out, string(b))
		}
	}
	add(activities.StreamEvent{Kind: activities.EventContent, Delta: "Hel"})
	add(activities.StreamEvent{Kind: activities.EventToolCall, ToolCall: &exchange.ToolCallDelta{Index: 0, ID: "c1", Type: "function", Name: "f"}})
	add(activities.StreamEvent{Kind: activities.EventUsage, Usage: &providers.Usage{TotalTokens: 9}})
	add(activities.StreamEvent{Kind: activities.EventEnd})
	if len(out) != 2 || !strings.Contains(out[0], `"role":"assistant","content":"Hel"`) || strings.Contains(out[1], "role") ||
		!strings.Contains(out[1], `"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":""}}]`) {
		t.Fatalf("%s", strings.Join(out, "\n"))
	}
	rest := ch.rest(&providers.Response{Text: "Hello", FinishReason: "stop"})
	if len(rest) != 3 || !strings.Contains(string(rest[0]), `"content":"lo"`) || !strings.Contains(string(rest[1]), `"finish_reason":"stop"`) ||
		!strings.Contains(string(rest[2]), `"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":9}`) {
		t.Fatalf("%s", rest)
	}
	// A partial answer gets neither a finish reason nor usage: the
	// in-band error follows instead.
	ch = &chunker{who: who, includeUsage: true}
	if rest := ch.rest(&providers.Response{Text: "He", Partial: true}); len(rest) != 1 {
		t.Fatalf("partial rest %s", rest)
	}
}
