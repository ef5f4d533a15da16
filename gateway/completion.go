package gateway

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// answerIdentity is what every rendering of one action's answer shares:
// the completion id is the action id, created and model are the ones the
// action was started with (kept in its memo), so a replay renders the same
// bytes.
type answerIdentity struct {
	ID      string
	Created int64
	Model   string
}

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
		Usage   wireUsage    `json:"usage"`
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
func completionJSON(who answerIdentity, r *providers.Response) []byte {
	if b, ok := rawCompletion(who, r); ok {
		return b
	}
	c := wireCompletion{
		ID: who.ID, Object: "chat.completion", Created: who.Created, Model: who.Model,
		Choices: []wireChoice{{Message: wireMessage{Role: "assistant", Content: strOrNull(r.Text), Refusal: strOrNull(r.Refusal)}, FinishReason: finishReasonOf(r)}},
		Usage:   usageOf(r.Usage),
	}
	if len(r.ToolCalls) > 0 && string(r.ToolCalls) != "null" {
		c.Choices[0].Message.ToolCalls = r.ToolCalls
	}
	b, _ := json.Marshal(c) // only marshallable values
	return append(b, '\n')
}

// rawCompletion is the provider's body with the gateway's identity.
func rawCompletion(who answerIdentity, r *providers.Response) ([]byte, bool) {
	if len(r.Raw) == 0 || r.Partial {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(r.Raw, &m) != nil || m == nil {
		return nil, false
	}
	var choices []json.RawMessage
	if json.Unmarshal(m["choices"], &choices) != nil || len(choices) == 0 {
		return nil, false
	}
	m["id"], _ = json.Marshal(who.ID)
	m["model"], _ = json.Marshal(who.Model)
	m["created"], _ = json.Marshal(who.Created)
	m["object"] = json.RawMessage(`"chat.completion"`)
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if enc.Encode(m) != nil {
		return nil, false
	}
	return out.Bytes(), true
}

// chunker renders one stream's hub events as chat.completion.chunk data.
// Not safe for concurrent use.
type chunker struct {
	who          answerIdentity
	includeUsage bool
	roleSent     bool
	// What has been sent, to complete the stream from the result and to
	// send the finish reason once.
	text, refusal strings.Builder
	toolCalls     int
	finishSent    bool
	usageSent     bool
	usage         *providers.Usage
}

// streamed reports whether any content was rendered.
func (c *chunker) streamed() bool {
	return c.text.Len() > 0 || c.refusal.Len() > 0 || c.toolCalls > 0
}

// chunk renders ev, or reports false for an event that is no chunk
// (stream_incomplete and end end the stream; usage when it was not asked
// for).
func (c *chunker) chunk(ev activities.StreamEvent) ([]byte, bool) {
	var d wireDelta
	var finish *string
	switch ev.Kind {
	case activities.EventContent:
		d.Content = &ev.Delta
		c.text.WriteString(ev.Delta)
	case activities.EventRefusal:
		d.Refusal = &ev.Refusal
		c.refusal.WriteString(ev.Refusal)
	case activities.EventToolCall:
		d.ToolCalls = []wireToolCall{toolCallDelta(*ev.ToolCall)}
		c.toolCalls = max(c.toolCalls, ev.ToolCall.Index+1)
	case activities.EventFinish:
		if c.finishSent {
			return nil, false
		}
		c.finishSent = true
		f := ev.FinishReason
		finish = &f
	case activities.EventUsage:
		u := *ev.Usage
		c.usage = &u
		return nil, false // sent once, at the end, if asked for
	default:
		return nil, false
	}
	if !c.roleSent && finish == nil {
		d.Role, c.roleSent = "assistant", true
	}
	return c.marshal(wireChunk{Choices: []wireChunkChoice{{Delta: d, FinishReason: finish}}}), true
}

func toolCallDelta(t exchange.ToolCallDelta) wireToolCall {
	i := t.Index
	return wireToolCall{Index: &i, ID: t.ID, Type: t.Type, Function: wireFunction{Name: t.Name, Arguments: t.Arguments}}
}

func (c *chunker) marshal(ch wireChunk) []byte {
	ch.ID, ch.Object, ch.Created, ch.Model = c.who.ID, "chat.completion.chunk", c.who.Created, c.who.Model
	b, _ := json.Marshal(ch) // only marshallable values
	return b
}

// rest is what a stream still owes once the action's answer r is known:
// the text the events did not carry (a provider that answered a stream
// with a whole body, a follower that started late), the tool calls when
// none were streamed, the finish reason, and the usage chunk if asked.
func (c *chunker) rest(r *providers.Response) [][]byte {
	var out [][]byte
	if r == nil {
		r = &providers.Response{}
	}
	if sent := c.text.String(); len(r.Text) > len(sent) && r.Text[:len(sent)] == sent {
		t := r.Text[len(sent):]
		b, _ := c.chunk(activities.StreamEvent{Kind: activities.EventContent, Delta: t})
		out = append(out, b)
	}
	if sent := c.refusal.String(); len(r.Refusal) > len(sent) && r.Refusal[:len(sent)] == sent {
		t := r.Refusal[len(sent):]
		b, _ := c.chunk(activities.StreamEvent{Kind: activities.EventRefusal, Refusal: t})
		out = append(out, b)
	}
	if c.toolCalls == 0 {
		var calls []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		if len(r.ToolCalls) > 0 && json.Unmarshal(r.ToolCalls, &calls) == nil {
			for i, tc := range calls {
				b, _ := c.chunk(activities.StreamEvent{Kind: activities.EventToolCall, ToolCall: &exchange.ToolCallDelta{
					Index: i, ID: tc.ID, Type: tc.Type, Name: tc.Function.Name, Arguments: tc.Function.Arguments}})
				out = append(out, b)
			}
		}
	}
	if !r.Partial && !c.finishSent {
		b, _ := c.chunk(activities.StreamEvent{Kind: activities.EventFinish, FinishReason: finishReasonOf(r)})
		out = append(out, b)
	}
	if c.includeUsage && !c.usageSent && !r.Partial {
		c.usageSent = true
		u := r.Usage
		if u == (providers.Usage{}) && c.usage != nil {
			u = *c.usage
		}
		wu := usageOf(u)
		out = append(out, c.marshal(wireChunk{Choices: []wireChunkChoice{}, Usage: &wu}))
	}
	return out
}
