package chat

import (
	"encoding/json"
	"strconv"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/openaiwire"
	"github.com/durallm/durallm/providers"
)

// encoder renders one stream as chat.completion.chunk events, numbered
// from 1 (each chunk's number is its SSE id), the role on the first, the
// finish reason and the usage chunk (when asked) at the end, then
// [DONE]; a partial answer ends with the in-band durallm_stream_incomplete
// error instead, and a failure with its in-band error, neither numbered.
// It is a function of what it is fed (answer.Encoder).
type encoder struct {
	who          answer.Identity
	includeUsage bool
	seq          uint64
	roleSent     bool
}

func (c *encoder) Start() []answer.Event { return nil }

func (c *encoder) Delta(d answer.Delta) []answer.Event {
	var wd wireDelta
	switch d.Kind {
	case answer.Text:
		t := d.Text
		wd.Content = &t
	case answer.Refusal:
		t := d.Text
		wd.Refusal = &t
	case answer.ToolCall:
		i := d.ToolCall.Index
		wd.ToolCalls = []wireToolCall{{Index: &i, ID: d.ToolCall.ID, Type: d.ToolCall.Type,
			Function: wireFunction{Name: d.ToolCall.Name, Arguments: d.ToolCall.Arguments}}}
	default:
		return nil
	}
	if !c.roleSent {
		wd.Role, c.roleSent = "assistant", true
	}
	return []answer.Event{c.chunk(wireChunk{Choices: []wireChunkChoice{{Delta: wd}}})}
}

func (c *encoder) End(a answer.Answer) []answer.Event {
	r := a.Response
	if a.Incomplete != "" {
		return c.Fail(answer.Problem{Kind: answer.StreamIncomplete, Code: a.Incomplete,
			Message: "the answer was cut after it started (" + a.Incomplete + "): what arrived is all there is, and no second answer follows"})
	}
	f := finishReasonOf(r)
	out := []answer.Event{c.chunk(wireChunk{Choices: []wireChunkChoice{{FinishReason: &f}}})}
	if c.includeUsage && r.Usage != (providers.Usage{}) {
		// Only usage the provider reported: 0/0 would read as a count.
		u := usageOf(r.Usage)
		out = append(out, c.chunk(wireChunk{Choices: []wireChunkChoice{}, Usage: &u}))
	}
	return append(out, answer.Event{Data: []byte("[DONE]")})
}

// Fail is the in-band error: every OpenAI SDK raises on it (openai-go:
// *ssestream.StreamError), and the stream closes without [DONE], whose
// bare absence openai-go would read as success.
func (c *encoder) Fail(p answer.Problem) []answer.Event {
	return []answer.Event{{Data: trimNewline(openaiwire.Body(openaiwire.ErrorObject(p)))}}
}

func (c *encoder) chunk(ch wireChunk) answer.Event {
	c.seq++
	ch.ID, ch.Object, ch.Created, ch.Model = c.who.ID, "chat.completion.chunk", c.who.Created, c.who.Model
	b, _ := json.Marshal(ch) // only marshallable values
	return answer.Event{Numbered: true, Seq: c.seq, ID: strconv.FormatUint(c.seq, 10), Data: b}
}

func trimNewline(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		return b[:n-1]
	}
	return b
}
