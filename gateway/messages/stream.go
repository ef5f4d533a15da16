package messages

import (
	"encoding/json"
	"strings"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// Encoder renders one action's stream, the numbered events of its hub
// (activities.StreamEvent), as Anthropic's server-sent events:
//
//	message_start (the message with empty content and usage)
//	content_block_start, content_block_delta..., content_block_stop  (per block)
//	message_delta (stop_reason, stop_sequence, usage)
//	message_stop
//
// with ping for keep-alives and, for a stream that does not end with an
// answer, one error event instead of message_delta and message_stop. Every
// event has its event: line, which the Anthropic SDKs need (they skip an
// event without one, and a stream of such events reads as empty).
//
// Text (and a refusal, which the Messages API carries as text) goes to a
// text block, each tool call to a tool_use block whose input arrives as
// input_json_delta pieces. A tool_use block stays open until a text block
// follows or the message ends, so that pieces of parallel calls that
// interleave each reach their own open block.
//
// It is deterministic (the same calls give the same bytes), keeps no
// reference to what it was given, and is not safe for concurrent use.
// Each method returns the bytes to write, nil when there are none.
type Encoder struct {
	who     Identity
	started bool
	ended   bool
	// blocks counts the blocks started; text is the open text block's
	// index, -1 for none; tools maps a call's index to its block, and open
	// lists the tool blocks not yet stopped, in order.
	blocks int
	text   int
	tools  map[int]int
	open   []int
	// args holds each tool block's input so far, by block index.
	args map[int]*strings.Builder
	// What was delivered, to complete the stream from the action's result.
	sentText, sentRefusal strings.Builder
	finish                string
	usage                 *providers.Usage
	lastSeq               uint64
	buf                   []byte
}

// NewEncoder returns an encoder for the answer who names.
func NewEncoder(who Identity) *Encoder {
	return &Encoder{who: who, text: -1, tools: map[int]int{}, args: map[int]*strings.Builder{}}
}

// Streamed reports whether any content was rendered.
func (e *Encoder) Streamed() bool { return e.blocks > 0 }

// LastSeq is the sequence number of the last event Event rendered.
func (e *Encoder) LastSeq() uint64 { return e.lastSeq }

// Start is message_start, once: the message with its id, model, empty
// content and usage (zero: the counts come with message_delta). Event,
// Complete and Incomplete send it first when it was not sent.
func (e *Encoder) Start() []byte {
	e.buf = e.buf[:0]
	e.start()
	return e.out()
}

func (e *Encoder) start() {
	if e.started {
		return
	}
	e.started = true
	type start struct {
		Type    string      `json:"type"`
		Message wireMessage `json:"message"`
	}
	e.event("message_start", start{Type: "message_start",
		Message: wireMessage{ID: e.who.ID, Type: "message", Role: "assistant", Model: e.who.Model, Content: []json.RawMessage{}}})
}

// Ping is a keep-alive: event: ping.
func (e *Encoder) Ping() []byte {
	return frame(nil, "ping", []byte(`{"type":"ping"}`))
}

// Event renders ev. Content, refusal and tool-call events become block
// events; the finish reason and usage are kept for message_delta;
// stream_incomplete and end render nothing (the caller ends the stream
// with Complete, Incomplete or Fail, from the action's result). An event
// numbered at or below the last one rendered is a repeat and renders
// nothing.
func (e *Encoder) Event(ev activities.StreamEvent) []byte {
	e.buf = e.buf[:0]
	if e.ended || (ev.Seq > 0 && ev.Seq <= e.lastSeq) {
		return nil
	}
	if ev.Seq > 0 {
		e.lastSeq = ev.Seq
	}
	switch ev.Kind {
	case activities.EventContent:
		e.textDelta(ev.Delta)
		e.sentText.WriteString(ev.Delta)
	case activities.EventRefusal:
		e.textDelta(ev.Refusal)
		e.sentRefusal.WriteString(ev.Refusal)
	case activities.EventToolCall:
		if ev.ToolCall != nil {
			e.toolDelta(*ev.ToolCall)
		}
	case activities.EventFinish:
		e.finish = ev.FinishReason
	case activities.EventUsage:
		if ev.Usage != nil {
			u := *ev.Usage
			e.usage = &u
		}
	}
	return e.out()
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

func (e *Encoder) textDelta(s string) {
	if s == "" {
		return
	}
	e.start()
	if e.text < 0 {
		e.stopTools()
		e.text = e.blocks
		e.blocks++
		e.event("content_block_start", wireBlockStart{Type: "content_block_start", Index: e.text, ContentBlock: wireText{Type: "text"}})
	}
	e.event("content_block_delta", wireBlockDelta{Type: "content_block_delta", Index: e.text, Delta: wireTextDelta{Type: "text_delta", Text: s}})
}

func (e *Encoder) toolDelta(d exchange.ToolCallDelta) {
	e.start()
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

func (e *Encoder) stopText() {
	if e.text >= 0 {
		e.event("content_block_stop", wireBlockStop{Type: "content_block_stop", Index: e.text})
		e.text = -1
	}
}

func (e *Encoder) stopTools() {
	for _, i := range e.open {
		e.event("content_block_stop", wireBlockStop{Type: "content_block_stop", Index: i})
	}
	e.open = e.open[:0]
}

// Complete ends the stream of an answer r (completed, or reconciled): the
// text and tool calls the events did not carry (a provider that answered
// a stream with a whole body, a reader that started late), then every
// open block's stop, message_delta with the stop_reason (StopReason) and
// the usage, and message_stop.
func (e *Encoder) Complete(r *providers.Response) []byte {
	r, ok := e.end(r)
	if !ok {
		return nil
	}
	e.stopText()
	e.stopTools()
	fin := *r
	if fin.FinishReason == "" {
		fin.FinishReason = e.finish
	}
	stop := StopReason(&fin)
	if stop == "end_turn" && len(e.tools) > 0 {
		stop = "tool_use"
	}
	u := r.Usage
	if u == (providers.Usage{}) && e.usage != nil {
		u = *e.usage
	}
	type delta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	e.event("message_delta", struct {
		Type  string    `json:"type"`
		Delta delta     `json:"delta"`
		Usage wireUsage `json:"usage"`
	}{"message_delta", delta{StopReason: stop}, wireUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}})
	e.event("message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"})
	return e.out()
}

// Incomplete ends the stream of an answer cut after it started
// (completed_partial): what r has that the events did not carry, the stop
// of every open block that is whole (the text block, and each tool_use
// block whose input is complete JSON: anthropic-sdk-go refreshes a block's
// typed view on its stop, and empties a cut input it finds there), then
// one error event, api_error with error_code durallm_stream_incomplete,
// naming why (reason). No message_delta or message_stop follows: the SDKs
// raise the error after the content they accumulated, and no second
// answer comes.
func (e *Encoder) Incomplete(r *providers.Response, reason string) []byte {
	if _, ok := e.end(r); !ok {
		return nil
	}
	e.stopText()
	for _, i := range e.open {
		if json.Valid([]byte(e.args[i].String())) {
			e.event("content_block_stop", wireBlockStop{Type: "content_block_stop", Index: i})
		}
	}
	e.buf = append(e.buf, ErrorFor(Problem{Kind: KindIncomplete, Reason: reason}).Event()...)
	return e.out()
}

// Fail ends the stream with err as one in-band error event, for an answer
// that is no success once the 200 went out (the stream's status is held
// until its first content, but not for ever).
func (e *Encoder) Fail(err *Error) []byte {
	e.buf = e.buf[:0]
	if e.ended {
		return nil
	}
	e.ended = true
	return err.Event()
}

// end begins the stream's end with an answer r (nil: none): message_start
// if it was not sent, and what r has that the events did not carry. ok is
// false when the stream had ended already.
func (e *Encoder) end(r *providers.Response) (_ *providers.Response, ok bool) {
	e.buf = e.buf[:0]
	if e.ended {
		return nil, false
	}
	e.ended = true
	if r == nil {
		r = &providers.Response{}
	}
	e.start()
	e.owed(r)
	return r, true
}

// owed renders what r has that the events did not carry: the rest of the
// text and of the refusal, and the tool calls when none streamed.
func (e *Encoder) owed(r *providers.Response) {
	if tail, ok := strings.CutPrefix(r.Text, e.sentText.String()); ok {
		e.textDelta(tail)
		e.sentText.WriteString(tail)
	}
	if tail, ok := strings.CutPrefix(r.Refusal, e.sentRefusal.String()); ok {
		e.textDelta(tail)
		e.sentRefusal.WriteString(tail)
	}
	if len(e.tools) == 0 {
		for _, c := range exchange.WholeChunk(*r).ToolCalls {
			e.toolDelta(c)
		}
	}
}

// event appends one event with v as its data.
func (e *Encoder) event(name string, v any) {
	b, _ := json.Marshal(v) // only marshallable values
	e.buf = frame(e.buf, name, b)
}

// out is what was rendered, as a copy the caller may keep.
func (e *Encoder) out() []byte {
	if len(e.buf) == 0 {
		return nil
	}
	return append([]byte(nil), e.buf...)
}
