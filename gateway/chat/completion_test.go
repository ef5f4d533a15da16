package chat

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
)

var who = answer.Identity{ID: "gw-abc", Created: 1700000000, Model: "demo"}

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

// data is what the events' data lines say, one per event.
func data(evs []answer.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, string(e.Data))
	}
	return out
}

// The encoder renders deltas as chunks numbered from 1 (the role on the
// first), then the finish reason, the usage chunk when asked and [DONE];
// the same input gives the same events.
func TestEncoderRendersDeltasThenTheEnd(t *testing.T) {
	run := func() []answer.Event {
		enc := Surface{}.Stream(who, Options{IncludeUsage: true})
		var evs []answer.Event
		evs = append(evs, enc.Start()...)
		evs = append(evs, enc.Delta(answer.Delta{Kind: answer.Text, Text: "Hel"})...)
		evs = append(evs, enc.Delta(answer.Delta{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: 0, ID: "c1", Type: "function", Name: "f"}})...)
		evs = append(evs, enc.End(answer.Answer{Identity: who, Response: &providers.Response{Text: "Hel", FinishReason: "stop", Usage: providers.Usage{TotalTokens: 9}}})...)
		return evs
	}
	evs := run()
	out := data(evs)
	if len(out) != 5 || !strings.Contains(out[0], `"role":"assistant","content":"Hel"`) || strings.Contains(out[1], "role") ||
		!strings.Contains(out[1], `"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":""}}]`) ||
		!strings.Contains(out[2], `"finish_reason":"stop"`) ||
		!strings.Contains(out[3], `"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":9}`) || out[4] != "[DONE]" {
		t.Fatalf("%s", strings.Join(out, "\n"))
	}
	for i, e := range evs[:4] {
		if !e.Numbered || e.Seq != uint64(i+1) || e.ID != strconv.Itoa(i+1) {
			t.Fatalf("event %d numbered %v seq %d id %q", i, e.Numbered, e.Seq, e.ID)
		}
	}
	if evs[4].Numbered {
		t.Fatal("[DONE] is numbered")
	}
	if strings.Join(data(run()), "\n") != strings.Join(out, "\n") {
		t.Fatal("the same input encodes otherwise")
	}
}

// A partial answer ends with the in-band stream_incomplete error, with
// neither a finish reason nor usage.
func TestEncoderEndsAPartialAnswerInBand(t *testing.T) {
	enc := Surface{}.Stream(who, Options{IncludeUsage: true})
	out := data(enc.End(answer.Answer{Identity: who, Response: &providers.Response{Text: "He", Partial: true}, Incomplete: "idle_timeout"}))
	if len(out) != 1 || !strings.Contains(out[0], `"type":"durallm_stream_incomplete"`) || !strings.Contains(out[0], `"code":"idle_timeout"`) {
		t.Fatalf("%s", out)
	}
}

// When the provider sent no usage, the answer says nothing of it: no
// usage chunk at the end of a stream, even asked for, and no usage member
// in a completion built from the response; 0/0 would read as a count.
func TestAnAnswerWithoutUsageSaysNothingOfIt(t *testing.T) {
	enc := Surface{}.Stream(who, Options{IncludeUsage: true})
	out := data(enc.End(answer.Answer{Identity: who, Response: &providers.Response{Text: "hi", FinishReason: "stop"}}))
	if len(out) != 2 || !strings.Contains(out[0], `"finish_reason":"stop"`) || out[1] != "[DONE]" {
		t.Fatalf("%s", strings.Join(out, "\n"))
	}
	if b := completionJSON(who, &providers.Response{Text: "hi"}); strings.Contains(string(b), `"usage"`) {
		t.Fatalf("%s", b)
	}
}
