package responses

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/openaiwire"
	"github.com/durallm/durallm/providers"
)

// encoder renders one stream of an action's answer (answer.Encoder) as
// the Responses API's server-sent events:
//
//	response.created, response.in_progress
//	per message item: response.output_item.added,
//	  per part: response.content_part.added, response.output_text.delta...
//	  (or response.refusal.delta...), response.output_text.done (or
//	  response.refusal.done), response.content_part.done;
//	  response.output_item.done
//	per function_call item: response.output_item.added,
//	  response.function_call_arguments.delta..., .done,
//	  response.output_item.done
//	response.completed (or response.incomplete)
//
// and, for a stream that does not end with a whole answer, response.failed
// (the response with its error) then the in-band error object chat's
// stream ends with, {"error": {...}}, which openai-go and openai-node
// raise. Each event's sequence_number counts from 0 and is the number the
// core resumes after (starting_after=N skips those up to N) and its SSE
// id:, so Responses' own cursor is the gateway's; the error object is not
// numbered (it is always sent).
//
// A function_call item stays open until text follows or the answer ends,
// so that pieces of parallel calls that interleave each reach their own
// item. Item ids are the action id and the item's output_index, so that
// the same answer has the same ids on every gateway.
//
// It is deterministic: the events, their numbers and the items are a
// function of what it was fed. Quiet, it makes no events and only builds
// the items (RenderResponse).
type encoder struct {
	who   answer.Identity
	quiet bool
	seq   uint64
	items []*item
	// msg is the open message item, nil for none; calls maps a call's
	// index to its item, and open lists the call items not yet done.
	msg   *item
	calls map[int]*item
	open  []*item
	out   []answer.Event
}

// item is one output item as it is built: a message (its parts, the open
// one last) or a function call.
type item struct {
	index int
	id    string
	// message
	parts []any
	part  any
	// function_call
	call *wireCall
}

func newEncoder(who answer.Identity, quiet bool) *encoder {
	return &encoder{who: who, quiet: quiet, calls: map[int]*item{}}
}

// evResponse is response.created, .in_progress, .completed, .incomplete
// and .failed.
type evResponse struct {
	Type           string       `json:"type"`
	Response       wireResponse `json:"response"`
	SequenceNumber uint64       `json:"sequence_number"`
}

// evItem is response.output_item.added and .done.
type evItem struct {
	Type           string `json:"type"`
	OutputIndex    int    `json:"output_index"`
	Item           any    `json:"item"`
	SequenceNumber uint64 `json:"sequence_number"`
}

// evPiece is every event about an item's content: a part added or done,
// a delta or the whole of a text, refusal or arguments.
type evPiece struct {
	Type           string      `json:"type"`
	ItemID         string      `json:"item_id"`
	OutputIndex    int         `json:"output_index"`
	ContentIndex   *int        `json:"content_index,omitempty"`
	Part           any         `json:"part,omitempty"`
	Delta          *string     `json:"delta,omitempty"`
	Text           *string     `json:"text,omitempty"`
	Refusal        *string     `json:"refusal,omitempty"`
	Name           string      `json:"name,omitempty"`
	Arguments      *string     `json:"arguments,omitempty"`
	Logprobs       *[]struct{} `json:"logprobs,omitempty"`
	SequenceNumber uint64      `json:"sequence_number"`
}

var noLogprobs = []struct{}{}

// Start is response.created and response.in_progress: the response, in
// progress, with no output yet.
func (e *encoder) Start() []answer.Event {
	r := e.response(statusInProgress, nil)
	e.event("response.created", func(seq uint64) any { return evResponse{"response.created", r, seq} })
	e.event("response.in_progress", func(seq uint64) any { return evResponse{"response.in_progress", r, seq} })
	return e.flush()
}

// Delta renders a piece of text, refusal or tool call.
func (e *encoder) Delta(d answer.Delta) []answer.Event {
	switch d.Kind {
	case answer.Text, answer.Refusal:
		if d.Text != "" {
			e.content(d.Kind, d.Text)
		}
	case answer.ToolCall:
		e.toolCall(d.ToolCall)
	}
	return e.flush()
}

func (e *encoder) content(k answer.DeltaKind, s string) {
	if e.msg == nil {
		e.doneCalls()
		e.msg = e.add(&item{})
		e.event("response.output_item.added", func(seq uint64) any {
			return evItem{"response.output_item.added", e.msg.index, e.msg.message(statusInProgress, false), seq}
		})
	}
	m := e.msg
	switch p := m.part.(type) {
	case *wireText:
		if k == answer.Text {
			p.Text += s
			e.piece("response.output_text.delta", evPiece{Delta: &s, Logprobs: &noLogprobs})
			return
		}
	case *wireRefusal:
		if k == answer.Refusal {
			p.Refusal += s
			e.piece("response.refusal.delta", evPiece{Delta: &s})
			return
		}
	}
	e.donePart()
	var fresh, part any
	if k == answer.Text {
		fresh, part = newText(""), newText(s)
	} else {
		fresh, part = &wireRefusal{Type: "refusal"}, &wireRefusal{Type: "refusal", Refusal: s}
	}
	m.part = part
	e.piece("response.content_part.added", evPiece{Part: fresh})
	if k == answer.Text {
		e.piece("response.output_text.delta", evPiece{Delta: &s, Logprobs: &noLogprobs})
	} else {
		e.piece("response.refusal.delta", evPiece{Delta: &s})
	}
}

func (e *encoder) toolCall(d answer.ToolCallDelta) {
	it, ok := e.calls[d.Index]
	if !ok {
		e.doneMessage(statusCompleted)
		it = e.add(&item{})
		id := d.ID
		if id == "" {
			// A route that names no call: the call_id its output must
			// name, the same on every gateway.
			id = "call_" + e.who.ID + "_" + strconv.Itoa(it.index)
		}
		it.call = &wireCall{ID: "fc_" + e.who.ID + "_" + strconv.Itoa(it.index), Type: "function_call", CallID: id, Name: d.Name}
		e.calls[d.Index] = it
		e.open = append(e.open, it)
		added := *it.call
		added.Status = statusInProgress
		e.event("response.output_item.added", func(seq uint64) any { return evItem{"response.output_item.added", it.index, added, seq} })
	}
	if d.Arguments != "" {
		it.call.Arguments += d.Arguments
		s := d.Arguments
		e.event("response.function_call_arguments.delta", func(seq uint64) any {
			return evPiece{Type: "response.function_call_arguments.delta", ItemID: it.call.ID, OutputIndex: it.index, Delta: &s, SequenceNumber: seq}
		})
	}
}

// add appends an output item.
func (e *encoder) add(it *item) *item {
	it.index = len(e.items)
	it.id = "msg_" + e.who.ID + "_" + strconv.Itoa(it.index)
	e.items = append(e.items, it)
	return it
}

// message is a message item as it stands: its whole parts, and the open
// one with them when withOpen.
func (it *item) message(status string, withOpen bool) wireMessage {
	parts := append([]any{}, it.parts...)
	if withOpen && it.part != nil {
		parts = append(parts, it.part)
	}
	return wireMessage{ID: it.id, Type: "message", Status: status, Content: parts, Role: "assistant"}
}

// piece adds an event about the open message's open part.
func (e *encoder) piece(name string, p evPiece) {
	m := e.msg
	ci := len(m.parts)
	e.event(name, func(seq uint64) any {
		p.Type, p.ItemID, p.OutputIndex, p.ContentIndex, p.SequenceNumber = name, m.id, m.index, &ci, seq
		return p
	})
}

// donePart ends the open message's open part: its text (or refusal) done,
// then content_part.done.
func (e *encoder) donePart() {
	m := e.msg
	if m == nil || m.part == nil {
		return
	}
	switch p := m.part.(type) {
	case *wireText:
		t := p.Text
		e.piece("response.output_text.done", evPiece{Text: &t, Logprobs: &noLogprobs})
	case *wireRefusal:
		r := p.Refusal
		e.piece("response.refusal.done", evPiece{Refusal: &r})
	}
	e.piece("response.content_part.done", evPiece{Part: m.part})
	m.parts = append(m.parts, m.part)
	m.part = nil
}

// doneMessage ends the open message item with status.
func (e *encoder) doneMessage(status string) {
	m := e.msg
	if m == nil {
		return
	}
	e.donePart()
	e.event("response.output_item.done", func(seq uint64) any {
		return evItem{"response.output_item.done", m.index, m.message(status, false), seq}
	})
	e.msg = nil
}

// doneCalls ends the open function_call items: their arguments done, then
// output_item.done.
func (e *encoder) doneCalls() {
	for _, it := range e.open {
		c := *it.call
		c.Status = statusCompleted
		e.event("response.function_call_arguments.done", func(seq uint64) any {
			return evPiece{Type: "response.function_call_arguments.done", ItemID: c.ID, OutputIndex: it.index, Name: c.Name, Arguments: &c.Arguments, SequenceNumber: seq}
		})
		e.event("response.output_item.done", func(seq uint64) any { return evItem{"response.output_item.done", it.index, c, seq} })
	}
	e.open = e.open[:0]
}

// End ends the stream of an answer: for a whole one, every open part and
// item done, then response.completed (or response.incomplete, when the
// provider stopped at its token limit or its content filter) with the
// response and its usage; for a partial one (completed_partial), the
// in-band end of Fail, durallm_stream_incomplete naming why it was cut.
func (e *encoder) End(a answer.Answer) []answer.Event {
	if a.Incomplete != "" {
		return e.Fail(answer.Problem{Kind: answer.StreamIncomplete, Code: a.Incomplete,
			Message: "the answer was cut after it started (" + a.Incomplete + "): what arrived is all there is, and no second answer follows"})
	}
	r := a.Response
	if r == nil {
		r = &providers.Response{}
	}
	final := e.final(r)
	e.doneMessage(final.Status)
	e.doneCalls()
	name := "response." + final.Status
	e.event(name, func(seq uint64) any { return evResponse{name, final, seq} })
	return e.flush()
}

// Fail ends the stream with p: the open message's part and item done as
// incomplete, and each function_call whose arguments are whole JSON done
// (a cut call is left out: it could not be run); then response.failed,
// the response with its error and what was output; then the in-band
// error object, not numbered.
func (e *encoder) Fail(p answer.Problem) []answer.Event {
	e.doneMessage(statusIncomplete)
	open := e.open
	e.open = nil
	for _, it := range open {
		if json.Valid([]byte(it.call.Arguments)) {
			e.open = append(e.open, it)
		}
	}
	e.doneCalls()
	o := openaiwire.ErrorObject(p)
	code := o.Code
	if code == "" {
		code = o.Type
	}
	failed := e.response(statusFailed, &wireError{Code: code, Message: o.Message})
	e.event("response.failed", func(seq uint64) any { return evResponse{"response.failed", failed, seq} })
	e.out = append(e.out, answer.Event{Data: bytes.TrimSuffix(openaiwire.Body(o), []byte("\n"))})
	return e.flush()
}

// final is the response an answer ends with: completed, or incomplete
// (incomplete_details.reason) for a partial answer or a finish reason of
// length (max_output_tokens) or content_filter.
func (e *encoder) final(r *providers.Response) wireResponse {
	status, reason := statusCompleted, ""
	switch {
	case r.Partial, r.FinishReason == "length":
		status, reason = statusIncomplete, "max_output_tokens"
	case r.FinishReason == "content_filter":
		status, reason = statusIncomplete, "content_filter"
	}
	w := e.response(status, nil)
	if reason != "" {
		w.IncompleteDetails = &wireIncomplete{Reason: reason}
	}
	w.Usage = usageOf(r.Usage)
	return w
}

// response is the response object with status and the items so far, each
// as it stands (an open message with its open part, in progress).
func (e *encoder) response(status string, err *wireError) wireResponse {
	w := wireResponse{ID: e.who.ID, Object: "response", CreatedAt: e.who.Created, Status: status, Error: err, Model: e.who.Model, Output: []any{}}
	itemStatus := status
	if status == statusFailed {
		itemStatus = statusIncomplete
	}
	for _, it := range e.items {
		if it.call != nil {
			c := *it.call
			c.Status = statusCompleted
			if status == statusFailed && !json.Valid([]byte(c.Arguments)) {
				// Cut: what arrived, never to be run as it stands.
				c.Status = statusIncomplete
			}
			w.Output = append(w.Output, c)
			continue
		}
		w.Output = append(w.Output, it.message(itemStatus, true))
	}
	return w
}

// event adds one numbered event; data makes its payload for its sequence
// number (not called when quiet).
func (e *encoder) event(name string, data func(seq uint64) any) {
	seq := e.seq
	e.seq++
	if e.quiet {
		return
	}
	b, _ := json.Marshal(data(seq)) // only marshallable values
	e.out = append(e.out, answer.Event{Numbered: true, Seq: seq, ID: strconv.FormatUint(seq, 10), Name: name, Data: b})
}

// flush hands over the events made since the last call.
func (e *encoder) flush() []answer.Event {
	out := e.out
	e.out = nil
	return out
}
