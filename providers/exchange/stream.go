package exchange

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

// MaxResponseBytes bounds a non-streaming body, and the text, refusal and
// tool-call arguments accumulated from a stream: 32 MiB.
const MaxResponseBytes = 32 << 20

// toolCallOverhead is what each distinct tool call is charged against
// MaxResponseBytes, so a stream of empty calls with ever-new indexes is
// bounded too.
const toolCallOverhead = 64

// errProviderError stops a stream that carried an error event; the error
// itself is in streamAcc.resp.Error.
var errProviderError = errors.New("exchange: stream carried an error event")

// streamAcc accumulates one answer from a stream (choice index 0 for
// chat completions) with bounded memory. The dialect's eventReader turns
// each event into text, refusal and tool-call deltas; apply accumulates
// them the same way for every dialect, so the size bound and the commit
// point are one piece of code.
type streamAcc struct {
	resp    providers.Response // ID, Model, FinishReason, Usage, Error
	text    strings.Builder
	refusal strings.Builder
	calls   []*callAcc
	byIndex map[int]*callAcc
	legacy  *callAcc // a legacy function_call, kept as a tool call
	size    int
	limit   int
	content bool // content has started
	done    bool // the stream's own end marker arrived ([DONE], message_stop)
	reader  eventReader
	// chunk is what the last event carried, for a ChunkSink; gotUsage
	// says the event being read carried usage.
	chunk    Chunk
	gotUsage bool
}

// eventReader reads one SSE event of a dialect into a streamAcc, with
// the contract of streamAcc.event.
type eventReader interface {
	read(a *streamAcc, name string, data []byte) (text string, first bool, err error)
}

type callAcc struct {
	pos           int // among the answer's calls, from 0
	id, typ, name string
	args          strings.Builder
	// startArgs stand in for the arguments when no argument delta came
	// (Anthropic sends a tool call's whole input in its start event when
	// it has nothing to stream).
	startArgs string
}

// newStreamAcc returns an accumulator for a chat.completion.chunk stream.
func newStreamAcc() *streamAcc {
	return &streamAcc{limit: MaxResponseBytes, byIndex: make(map[int]*callAcc), reader: openaiEvents{}}
}

// event applies one SSE event. It returns the text delta for the sink and
// whether this event carried the stream's first content (text, refusal or
// a tool-call delta): the caller commits the attempt before using it.
// Errors: ErrMalformedStream, ErrResponseTooLarge (the event is then not
// applied) and errProviderError.
func (a *streamAcc) event(name string, data []byte) (text string, first bool, err error) {
	a.chunk, a.gotUsage = Chunk{}, false
	return a.reader.read(a, name, data)
}

// takeChunk returns what the last event carried for the caller, and
// nothing before the content started.
func (a *streamAcc) takeChunk() Chunk {
	c := a.chunk
	a.chunk = Chunk{}
	if !a.content {
		return Chunk{}
	}
	if a.gotUsage {
		u := a.resp.Usage
		c.Usage = &u
	}
	return c
}

// payload trims an event's data for a reader: nil for no data or for
// "[DONE]" (which marks the stream done), ErrMalformedStream when it is
// not JSON. The error never quotes the data.
func (a *streamAcc) payload(data []byte) ([]byte, error) {
	t := bytes.TrimSpace(data)
	if string(t) == "[DONE]" {
		a.done = true
		return nil, nil
	}
	if len(t) == 0 {
		return nil, nil
	}
	if !json.Valid(t) {
		return nil, fmt.Errorf("%w (%d bytes)", ErrMalformedStream, len(t))
	}
	return t, nil
}

// fail records the provider's error event and stops the stream.
func (a *streamAcc) fail(e *providers.APIError) error {
	a.resp.Error = e
	return errProviderError
}

// eventError reads an error event: its error member, or the event itself
// as a flattened error object.
func eventError(event []byte, member json.RawMessage) *providers.APIError {
	if e := parseAPIError(member); e != nil {
		return e
	}
	var w wireError
	obj(event, &w)
	return &providers.APIError{Type: str(w.Type), Code: str(w.Code), Param: str(w.Param), Message: str(w.Message)}
}

// apply accumulates one event's deltas, all or nothing: past the size
// bound it applies none of them and returns ErrResponseTooLarge. first
// reports that this event started the content.
func (a *streamAcc) apply(text, refusal string, deltas []toolDelta, finish string) (first bool, err error) {
	cost := len(text) + len(refusal)
	for _, d := range deltas {
		cost += len(d.id) + len(d.typ) + len(d.name) + len(d.args) + len(d.startArgs)
		if a.lookup(d) == nil {
			cost += toolCallOverhead
		}
	}
	if a.size+cost > a.limit {
		return false, fmt.Errorf("%w (limit %d bytes)", ErrResponseTooLarge, a.limit)
	}
	a.size += cost
	if finish != "" {
		a.resp.FinishReason = finish
	}
	a.text.WriteString(text)
	a.refusal.WriteString(refusal)
	a.chunk = Chunk{Text: text, Refusal: refusal, FinishReason: finish}
	hasCall := false
	for _, d := range deltas {
		i := a.applyToolDelta(d)
		if d.id != "" || d.name != "" || d.args != "" || d.startArgs != "" {
			args := d.args
			if args == "" && d.startArgs != emptyInput {
				// An empty start input is no piece: the input streams
				// next, or comes with the block's stop (anthropicEvents).
				args = d.startArgs
			}
			a.chunk.ToolCalls = append(a.chunk.ToolCalls, ToolCallDelta{Index: i, ID: d.id, Type: d.typ, Name: d.name, Arguments: args})
		}
		hasCall = hasCall || d.id != "" || d.name != "" || d.args != ""
	}
	if a.content || (text == "" && refusal == "" && !hasCall) {
		return false, nil
	}
	a.content = true
	return true, nil
}

// openaiEvents reads chat.completion.chunk events.
type openaiEvents struct{}

func (openaiEvents) read(a *streamAcc, name string, data []byte) (text string, first bool, err error) {
	t, err := a.payload(data)
	if t == nil || err != nil {
		return "", false, err
	}
	var b wireBody
	if !obj(t, &b) {
		return "", false, nil // a bare JSON value carries nothing we know
	}
	if !isNull(b.Error) || name == "error" {
		return "", false, a.fail(eventError(t, b.Error))
	}
	if a.resp.ID == "" {
		a.resp.ID = str(b.ID)
	}
	if a.resp.Model == "" {
		a.resp.Model = str(b.Model)
	}
	if !isNull(b.Usage) {
		a.resp.Usage = parseUsage(b.Usage)
		a.gotUsage = true
	}
	// Builders, not +=: one event may hold many index-0 choices, and
	// repeated concatenation would be quadratic in the event's size.
	var tb, rb strings.Builder
	var deltas []toolDelta
	var finish string
	for _, c := range arr(b.Choices) {
		var ch wireChoice
		if !obj(c, &ch) {
			continue
		}
		if i, ok := num(ch.Index); ok && i != 0 {
			continue // only the first choice is kept
		}
		if f := str(ch.FinishReason); f != "" {
			finish = f
		}
		var m wireMessage
		if !obj(ch.Delta, &m) {
			obj(ch.Message, &m)
		}
		if t := contentText(m.Content); t != "" {
			tb.WriteString(t)
		} else {
			tb.WriteString(str(ch.Text)) // legacy completions stream
		}
		rb.WriteString(str(m.Refusal))
		deltas = appendToolDeltas(deltas, m.ToolCalls, m.FunctionCall)
	}
	text = tb.String()
	first, err = a.apply(text, rb.String(), deltas, finish)
	if err != nil {
		return "", false, err
	}
	return text, first, nil
}

// toolDelta is one element of a delta's tool_calls (or a legacy
// function_call).
type toolDelta struct {
	index     int
	hasIndex  bool
	legacy    bool
	id, typ   string
	name      string
	args      string
	startArgs string // see callAcc.startArgs
}

func appendToolDeltas(out []toolDelta, calls, fn json.RawMessage) []toolDelta {
	for _, c := range arr(calls) {
		var w wireToolCall
		if !obj(c, &w) {
			continue
		}
		var f wireFunction
		obj(w.Function, &f)
		d := toolDelta{id: str(w.ID), typ: str(w.Type), name: str(f.Name), args: argsText(f.Arguments)}
		d.index, d.hasIndex = num(w.Index)
		out = append(out, d)
	}
	var f wireFunction
	if obj(fn, &f) {
		out = append(out, toolDelta{legacy: true, typ: "function", name: str(f.Name), args: argsText(f.Arguments)})
	}
	return out
}

// argsText reads function arguments: OpenAI sends a JSON-encoded string;
// some compatible providers send the object itself.
func argsText(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		return string(t)
	}
	return str(t)
}

// lookup finds the call a delta continues, nil when it starts a new one.
func (a *streamAcc) lookup(d toolDelta) *callAcc {
	switch {
	case d.legacy:
		return a.legacy
	case d.hasIndex:
		return a.byIndex[d.index]
	case len(a.calls) == 0:
		return nil
	default:
		// No index: a new id starts a new call, anything else continues
		// the last one.
		last := a.calls[len(a.calls)-1]
		if d.id != "" && last.id != "" && d.id != last.id {
			return nil
		}
		return last
	}
}

// applyToolDelta applies d and returns the position of its call.
func (a *streamAcc) applyToolDelta(d toolDelta) int {
	c := a.lookup(d)
	if c == nil {
		c = &callAcc{pos: len(a.calls)}
		a.calls = append(a.calls, c)
		switch {
		case d.legacy:
			a.legacy = c
		case d.hasIndex:
			a.byIndex[d.index] = c
		}
	}
	if c.id == "" {
		c.id = d.id
	}
	if c.typ == "" {
		c.typ = d.typ
	}
	if c.name == "" {
		c.name = d.name
	}
	if c.startArgs == "" {
		c.startArgs = d.startArgs
	}
	c.args.WriteString(d.args)
	return c.pos
}

// response returns what has accumulated.
func (a *streamAcc) response() providers.Response {
	r := a.resp
	r.Text, r.Refusal = a.text.String(), a.refusal.String()
	if len(a.calls) > 0 {
		out := make([]toolCall, 0, len(a.calls))
		for _, c := range a.calls {
			args := c.args.String()
			if args == "" {
				args = c.startArgs
			}
			out = append(out, toolCall{ID: c.id, Type: c.typ, Name: c.name, Arguments: args})
		}
		r.ToolCalls = toolCallsJSON(out)
	}
	return r
}

// toolCall is one assembled tool call.
type toolCall struct {
	ID, Type, Name, Arguments string
}

// toolCallsJSON renders tool calls in OpenAI's shape, so a caller sees one
// shape whichever dialect answered: [{"id", "type": "function",
// "function": {"name", "arguments": "<JSON text>"}}].
func toolCallsJSON(calls []toolCall) json.RawMessage {
	type fn struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type call struct {
		ID       string `json:"id,omitempty"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	out := make([]call, 0, len(calls))
	for _, c := range calls {
		typ := c.Type
		if typ == "" {
			typ = "function"
		}
		out = append(out, call{ID: c.ID, Type: typ, Function: fn{Name: c.Name, Arguments: c.Arguments}})
	}
	b, err := json.Marshal(out)
	if err != nil {
		// Only strings go in, so this cannot happen; no calls beats a
		// broken array.
		return nil
	}
	return b
}

// complete reports whether the stream ended properly: its end marker
// ([DONE], message_stop), or a finish reason before the end of the body.
func (a *streamAcc) complete() bool { return a.done || a.resp.FinishReason != "" }

// streamHooks are the side effects of consuming a stream, in the order the
// contract needs: commit before the first content is handed on.
type streamHooks struct {
	// commit is called once, just before the first content is handed to
	// delta (or, for a refusal or tool call, accumulated).
	commit func()
	// delta receives each non-empty text delta.
	delta func(string)
	// chunk, when set, receives each event's pieces after the commit
	// instead of delta.
	chunk func(Chunk)
}

// consumeStream reads events until the stream's end marker, the end of
// the body or an error. It returns nil at the marker or io.EOF;
// ErrTruncatedBody when the body ends inside an event whose data is not
// complete; otherwise the decoder's, the reader's or the accumulator's
// error.
func consumeStream(dec *sseDecoder, acc *streamAcc, h streamHooks) error {
	for !acc.done {
		name, data, err := dec.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if dec.unterminated() && !completeData(data) {
			// The body ended inside an event: a cut, not an event that
			// is not JSON.
			return fmt.Errorf("%w (the last event stops after %d bytes of data)", ErrTruncatedBody, len(data))
		}
		text, first, err := acc.event(name, data)
		if err != nil {
			return err
		}
		if first && h.commit != nil {
			h.commit()
		}
		if h.chunk != nil {
			if c := acc.takeChunk(); !c.Empty() {
				h.chunk(c)
			}
		} else if text != "" && h.delta != nil {
			h.delta(text)
		}
	}
	return nil
}

// completeData reports that an event's data can be read as it stands:
// empty, [DONE] or a whole JSON value.
func completeData(data []byte) bool {
	t := bytes.TrimSpace(data)
	return len(t) == 0 || string(t) == "[DONE]" || json.Valid(t)
}

// streamSignal says whether a stream that ended without a transport error
// produced anything usable.
func streamSignal(r providers.Response) evidence.Signal {
	return completionSignal(r)
}

// WholeChunk is a complete answer as one chunk: for a provider that
// answered a streamed request with a whole body, and for a front door
// completing a stream from the action's result. Its tool calls are read
// from r.ToolCalls as generously as a provider's body is.
func WholeChunk(r providers.Response) Chunk {
	u := r.Usage
	c := Chunk{Text: r.Text, Refusal: r.Refusal, FinishReason: r.FinishReason, Usage: &u}
	for i, raw := range arr(r.ToolCalls) {
		var w wireToolCall
		if !obj(raw, &w) {
			continue
		}
		var f wireFunction
		obj(w.Function, &f)
		c.ToolCalls = append(c.ToolCalls, ToolCallDelta{Index: i, ID: str(w.ID), Type: str(w.Type), Name: str(f.Name), Arguments: argsText(f.Arguments)})
	}
	return c
}
