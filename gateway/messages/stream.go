package messages

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
)

// encoder renders one stream of an action's answer (answer.Encoder) as
// Anthropic's server-sent events:
//
//	message_start (the message with empty content and usage)
//	content_block_start, content_block_delta..., content_block_stop  (per block)
//	message_delta (stop_reason, stop_sequence, usage)
//	message_stop
//
// and, for a stream that does not end with a whole answer, one error event
// instead of message_delta and message_stop. Every event has its event:
// line, which the Anthropic SDKs need (they skip an event without one, and
// a stream of such events reads as empty). The gateway's keep-alives are
// SSE comments, which the SDKs skip as they skip Anthropic's ping.
//
// Every event but the error is numbered from 1, its number its SSE id:,
// so a reader cut off resumes after the last id it read
// (GET /v1/messages/{id}?stream=true&starting_after=N).
//
// Text (and a refusal, which the Messages API carries as text) goes to a
// text block, each tool call to a tool_use block whose input arrives as
// input_json_delta pieces. A tool_use block stays open until a text block
// follows or the message ends, so that pieces of parallel calls that
// interleave each reach their own open block.
//
// It is deterministic: the events and their numbers are a function of
// what it was fed.
type encoder struct {
	who answer.Identity
	seq uint64
	// blocks counts the blocks started; text is the open text block's
	// index, -1 for none; tools maps a call's index to its block, and open
	// lists the tool blocks not yet stopped, in order.
	blocks int
	text   int
	tools  map[int]int
	open   []int
	// args holds each tool block's input so far, by block index.
	args map[int]*strings.Builder
	out  []answer.Event
}

func newEncoder(who answer.Identity) *encoder {
	return &encoder{who: who, text: -1, tools: map[int]int{}, args: map[int]*strings.Builder{}}
}

type (
	wireBlockStart struct {
		Type         string `json:"type"`
		Index        int    `json:"index"`
		ContentBlock any    `json:"content_block"`
	}
	wireBlockDelta struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
		Delta any    `json:"delta"`
	}
	wireTextDelta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	wireJSONDelta struct {
		Type        string `json:"type"`
		PartialJSON string `json:"partial_json"`
	}
	wireBlockStop struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
)

// Start is message_start: the message with its id, model, empty content
// and usage (zero: the counts come with message_delta).
func (e *encoder) Start() []answer.Event {
	type start struct {
		Type    string      `json:"type"`
		Message wireMessage `json:"message"`
	}
	e.event("message_start", start{Type: "message_start",
		Message: wireMessage{ID: e.who.ID, Type: "message", Role: "assistant", Model: e.who.Model, Content: []json.RawMessage{}}})
	return e.flush()
}

// Delta renders a piece of text, refusal or tool call as block events.
func (e *encoder) Delta(d answer.Delta) []answer.Event {
	switch d.Kind {
	case answer.Text, answer.Refusal:
		e.textDelta(d.Text)
	case answer.ToolCall:
		e.toolDelta(d.ToolCall)
	}
	return e.flush()
}

func (e *encoder) textDelta(s string) {
	if s == "" {
		return
	}
	if e.text < 0 {
		e.stopTools()
		e.text = e.blocks
		e.blocks++
		e.event("content_block_start", wireBlockStart{Type: "content_block_start", Index: e.text, ContentBlock: wireText{Type: "text"}})
	}
	e.event("content_block_delta", wireBlockDelta{Type: "content_block_delta", Index: e.text, Delta: wireTextDelta{Type: "text_delta", Text: s}})
}

func (e *encoder) toolDelta(d answer.ToolCallDelta) {
	idx, ok := e.tools[d.Index]
	if !ok {
		e.stopText()
		idx = e.blocks
		e.blocks++
		e.tools[d.Index] = idx
		e.open = append(e.open, idx)
		e.args[idx] = &strings.Builder{}
		e.event("content_block_start", wireBlockStart{Type: "content_block_start", Index: idx,
			ContentBlock: wireToolUse{Type: "tool_use", ID: d.ID, Name: d.Name, Input: json.RawMessage("{}")}})
	}
	if d.Arguments != "" {
		e.args[idx].WriteString(d.Arguments)
		e.event("content_block_delta", wireBlockDelta{Type: "content_block_delta", Index: idx, Delta: wireJSONDelta{Type: "input_json_delta", PartialJSON: d.Arguments}})
	}
}

func (e *encoder) stopText() {
	if e.text >= 0 {
		e.event("content_block_stop", wireBlockStop{Type: "content_block_stop", Index: e.text})
		e.text = -1
	}
}

func (e *encoder) stopTools() {
	for _, i := range e.open {
		e.event("content_block_stop", wireBlockStop{Type: "content_block_stop", Index: i})
	}
	e.open = e.open[:0]
}

// End ends the stream of an answer: for a whole one, every open block's
// stop, message_delta with the stop_reason (StopReason, tool_use when
// tool calls streamed and the finish reason says only that it stopped)
// and the usage, and message_stop; for a partial one (completed_partial),
// the in-band error durallm_stream_incomplete naming why it was cut
// (Fail).
func (e *encoder) End(a answer.Answer) []answer.Event {
	if a.Incomplete != "" {
		return e.Fail(answer.Problem{Kind: answer.StreamIncomplete, Code: CodeStreamIncomplete,
			Message: "the answer was cut after it started (" + a.Incomplete + "): what arrived is all there is, and no second answer follows"})
	}
	r := a.Response
	if r == nil {
		r = &providers.Response{}
	}
	e.stopText()
	e.stopTools()
	stop := StopReason(r)
	if stop == "end_turn" && len(e.tools) > 0 {
		stop = "tool_use"
	}
	type delta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	e.event("message_delta", struct {
		Type  string    `json:"type"`
		Delta delta     `json:"delta"`
		Usage wireUsage `json:"usage"`
	}{"message_delta", delta{StopReason: stop}, wireUsage{InputTokens: r.Usage.PromptTokens, OutputTokens: r.Usage.CompletionTokens}})
	e.event("message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"})
	return e.flush()
}

// Fail ends the stream with p as one in-band error event, after the stop
// of every open block that is whole: the text block, and each tool_use
// block whose input is complete JSON (anthropic-sdk-go refreshes a block's
// typed view on its stop, and empties a cut input it finds there). No
// message_delta or message_stop follows: the SDKs raise the error after
// the content they accumulated, and no second answer comes.
func (e *encoder) Fail(p answer.Problem) []answer.Event {
	e.stopText()
	open := e.open
	e.open = nil
	for _, i := range open {
		if json.Valid([]byte(e.args[i].String())) {
			e.event("content_block_stop", wireBlockStop{Type: "content_block_stop", Index: i})
		}
	}
	e.out = append(e.out, errorEvent(p))
	return e.flush()
}

// event adds one numbered event with v as its data.
func (e *encoder) event(name string, v any) {
	b, _ := json.Marshal(v) // only marshallable values
	e.seq++
	e.out = append(e.out, answer.Event{Numbered: true, Seq: e.seq, ID: strconv.FormatUint(e.seq, 10), Name: name, Data: b})
}

// flush hands over the events made since the last call.
func (e *encoder) flush() []answer.Event {
	out := e.out
	e.out = nil
	return out
}
