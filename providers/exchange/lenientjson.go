package exchange

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

// ErrMalformedResponse is returned for a 2xx body that is not JSON at all.
// It never quotes the body.
var ErrMalformedResponse = errors.New("exchange: response body is not JSON")

// ErrTruncatedBody is returned, with evidence.SignalStreamIncomplete, for
// a 2xx body that ended cleanly in the middle of what it was sending: a
// JSON body cut mid-value, or a stream whose last event stops before its
// blank line with data that is not yet complete. The provider accepted
// and ran the request and its answer was lost on the way, which a proxy
// that relays an origin's failure as a clean end produces: before content
// that is ambiguous, not an empty response to fall back from. It never
// quotes the body.
var ErrTruncatedBody = errors.New("exchange: response body cut short")

// ErrMalformedStream is returned when an SSE event's data is not JSON.
var ErrMalformedStream = errors.New("exchange: stream event is not JSON")

// ErrResponseTooLarge is returned when a body, or the answer accumulated
// from a stream, passes MaxResponseBytes.
var ErrResponseTooLarge = errors.New("exchange: response too large")

// The wire shapes, every member kept raw: drifted types (a number sent as
// a string, null where an array belongs) then never fail the decode, and
// each member is read by the lenient helpers below.
type wireBody struct {
	ID      json.RawMessage `json:"id"`
	Model   json.RawMessage `json:"model"`
	Status  json.RawMessage `json:"status"`
	Choices json.RawMessage `json:"choices"`
	Usage   json.RawMessage `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type wireChoice struct {
	Index        json.RawMessage `json:"index"`
	Message      json.RawMessage `json:"message"`
	Delta        json.RawMessage `json:"delta"`
	Text         json.RawMessage `json:"text"` // legacy completions
	FinishReason json.RawMessage `json:"finish_reason"`
}

type wireMessage struct {
	Content      json.RawMessage `json:"content"`
	Refusal      json.RawMessage `json:"refusal"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	FunctionCall json.RawMessage `json:"function_call"`
}

type wireToolCall struct {
	Index    json.RawMessage `json:"index"`
	ID       json.RawMessage `json:"id"`
	Type     json.RawMessage `json:"type"`
	Function json.RawMessage `json:"function"`
}

type wireFunction struct {
	Name      json.RawMessage `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type wireUsage struct {
	PromptTokens     json.RawMessage `json:"prompt_tokens"`
	CompletionTokens json.RawMessage `json:"completion_tokens"`
	TotalTokens      json.RawMessage `json:"total_tokens"`
	InputTokens      json.RawMessage `json:"input_tokens"`
	OutputTokens     json.RawMessage `json:"output_tokens"`
	// PromptDetails is OpenAI's prompt_tokens_details (input_tokens_details
	// in the Responses shape), whose cached_tokens are the prompt tokens
	// its cache served.
	PromptDetails json.RawMessage `json:"prompt_tokens_details"`
	InputDetails  json.RawMessage `json:"input_tokens_details"`
}

type wireTokenDetails struct {
	CachedTokens json.RawMessage `json:"cached_tokens"`
}

type wireError struct {
	Type    json.RawMessage `json:"type"`
	Code    json.RawMessage `json:"code"`
	Param   json.RawMessage `json:"param"`
	Message json.RawMessage `json:"message"`
}

// isNull reports an absent or null member.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// obj decodes raw into v when raw is a JSON object, reporting whether it
// was. With every member of v raw, the decode cannot fail on types.
func obj(raw json.RawMessage, v any) bool {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] != '{' {
		return false
	}
	return json.Unmarshal(t, v) == nil
}

// arr returns raw's elements when raw is a JSON array, else nil.
func arr(raw json.RawMessage) []json.RawMessage {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] != '[' {
		return nil
	}
	var out []json.RawMessage
	if json.Unmarshal(t, &out) != nil {
		return nil
	}
	return out
}

// str reads a string member; a number or boolean is read as its literal
// text (a numeric error code, say); anything else is "".
func str(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return ""
	}
	switch t[0] {
	case '"':
		var s string
		if json.Unmarshal(t, &s) == nil {
			return s
		}
		return ""
	case '{', '[', 'n':
		return ""
	default:
		return string(t)
	}
}

// num reads an integer member sent as a number (integral or not) or as a
// string holding one, reporting whether there was one.
func num(raw json.RawMessage) (int, bool) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return 0, false
	}
	s := string(t)
	if t[0] == '"' {
		s = strings.TrimSpace(str(t))
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.Abs(f) > 1e15 {
		return 0, false
	}
	return int(f), true
}

// contentText reads message content: a string, or an array of parts whose
// text parts are joined (string parts, or objects with a string "text").
func contentText(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return ""
	}
	if t[0] != '[' {
		return str(t)
	}
	var b strings.Builder
	for _, part := range arr(t) {
		p := bytes.TrimSpace(part)
		if len(p) > 0 && p[0] == '"' {
			b.WriteString(str(p))
			continue
		}
		var tp struct {
			Text json.RawMessage `json:"text"`
		}
		if obj(p, &tp) {
			b.WriteString(str(tp.Text))
		}
	}
	return b.String()
}

func parseUsage(raw json.RawMessage) providers.Usage {
	var w wireUsage
	if !obj(raw, &w) {
		return providers.Usage{}
	}
	var u providers.Usage
	var ok bool
	if u.PromptTokens, ok = num(w.PromptTokens); !ok {
		u.PromptTokens, _ = num(w.InputTokens)
	}
	if u.CompletionTokens, ok = num(w.CompletionTokens); !ok {
		u.CompletionTokens, _ = num(w.OutputTokens)
	}
	if u.TotalTokens, ok = num(w.TotalTokens); !ok {
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
	}
	for _, raw := range []json.RawMessage{w.PromptDetails, w.InputDetails} {
		var d wireTokenDetails
		if obj(raw, &d) {
			if n, ok := num(d.CachedTokens); ok && n > 0 {
				u.CachedTokens = n
				break
			}
		}
	}
	return u
}

// parseAPIError reads an error member: an object, or a bare string taken
// as the message. Nil when absent or null.
func parseAPIError(raw json.RawMessage) *providers.APIError {
	if isNull(raw) {
		return nil
	}
	var w wireError
	if obj(raw, &w) {
		return &providers.APIError{Type: str(w.Type), Code: str(w.Code), Param: str(w.Param), Message: str(w.Message)}
	}
	if s := str(raw); s != "" {
		return &providers.APIError{Message: s}
	}
	return &providers.APIError{}
}

// errorSignal maps a provider error object to the signal the classifier
// needs. Codes and types are compared case-insensitively; either member
// may carry any of the values, since providers disagree on which to use.
func errorSignal(e *providers.APIError) evidence.Signal {
	if e == nil {
		return evidence.SignalNone
	}
	code, typ := strings.ToLower(e.Code), strings.ToLower(e.Type)
	is := func(vals ...string) bool {
		for _, v := range vals {
			if code == v || typ == v {
				return true
			}
		}
		return false
	}
	switch {
	case is("model_not_found"):
		return evidence.SignalModelNotFound
	case is("context_length_exceeded"), strings.Contains(strings.ToLower(e.Message), "maximum context length"):
		return evidence.SignalContextTooLong
	case is("overloaded_error", "server_overloaded"):
		return evidence.SignalOverloaded
	case is("content_filter", "content_policy_violation"):
		return evidence.SignalContentFiltered
	default:
		return evidence.SignalNone
	}
}

// syntaxOffset says where a body stops being JSON, without quoting it.
func syntaxOffset(data []byte) error {
	var v json.RawMessage
	err := json.Unmarshal(data, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("%w (syntax error at byte %d of %d)", ErrMalformedResponse, se.Offset, len(data))
	}
	return fmt.Errorf("%w (%d bytes)", ErrMalformedResponse, len(data))
}

// truncatedJSON reports that t is the start of a JSON value that ends
// before the value does: every byte was valid so far and only the end of
// input is wrong. The decoder says so with io.ErrUnexpectedEOF, and with
// a *json.SyntaxError for a byte that is wrong wherever it stands.
func truncatedJSON(t []byte) bool {
	var v json.RawMessage
	err := json.NewDecoder(bytes.NewReader(t)).Decode(&v)
	return errors.Is(err, io.ErrUnexpectedEOF)
}

// decodeBody starts every dialect's reading of a 2xx body: the body
// (trimmed) goes into Raw, and an object is decoded into v. ok is false
// when there is nothing to read further: an empty body, a JSON value that
// is not an object, a body cut mid-value (ErrTruncatedBody) or a body
// that is not JSON at all (then err says where it stops being JSON,
// without quoting it). Raw is empty for the last two.
func decodeBody(data []byte, v any) (r providers.Response, ok bool, err error) {
	t := bytes.TrimSpace(data)
	if len(t) == 0 {
		return providers.Response{}, false, nil
	}
	if !json.Valid(t) {
		if truncatedJSON(t) {
			return providers.Response{}, false, fmt.Errorf("%w (JSON ends early, after %d bytes)", ErrTruncatedBody, len(t))
		}
		return providers.Response{}, false, syntaxOffset(t)
	}
	r.Raw = json.RawMessage(t)
	return r, obj(t, v), nil
}

// unreadSignal is the signal of a 2xx body decodeBody could not read
// further: a cut is a body that failed (ambiguous before content), while
// anything else, not JSON or no object, is an executed request that
// produced nothing usable.
func unreadSignal(err error) evidence.Signal {
	if errors.Is(err, ErrTruncatedBody) {
		return evidence.SignalStreamIncomplete
	}
	return evidence.SignalEmptyResponse
}

// parseCompletion reads a 2xx non-streaming body generously. A body that
// is not JSON at all is an error with SignalEmptyResponse, since an
// executed request produced nothing usable; one cut mid-value is
// ErrTruncatedBody with SignalStreamIncomplete.
func parseCompletion(data []byte) (providers.Response, evidence.Signal, error) {
	var b wireBody
	r, ok, err := decodeBody(data, &b)
	if !ok {
		return r, unreadSignal(err), err
	}
	r.ID, r.Model, r.Status = str(b.ID), str(b.Model), str(b.Status)
	r.Usage = parseUsage(b.Usage)
	r.Error = parseAPIError(b.Error)
	if ch, ok := firstChoice(b.Choices); ok {
		r.FinishReason = str(ch.FinishReason)
		var m wireMessage
		if !obj(ch.Message, &m) {
			obj(ch.Delta, &m) // a proxy that re-wrapped a stream
		}
		r.Text = contentText(m.Content)
		if r.Text == "" {
			r.Text = str(ch.Text)
		}
		r.Refusal = str(m.Refusal)
		r.ToolCalls = toolCallsOf(m.ToolCalls, m.FunctionCall)
	}
	return r, completionSignal(r), nil
}

// completionSignal says whether a parsed 2xx chat-completions response is
// usable.
func completionSignal(r providers.Response) evidence.Signal {
	return completionSignalWith(r, errorSignal)
}

// completionSignalWith says whether a parsed 2xx response is usable,
// mapping an error member with the dialect's errSignal. A status
// (in_progress, queued) exempts nothing: only a background Responses-API
// call has an answer that comes later, and no adapter makes one, so a
// chat completion that says so and carries nothing is empty.
func completionSignalWith(r providers.Response, errSignal func(*providers.APIError) evidence.Signal) evidence.Signal {
	switch {
	case r.Text != "" || r.Refusal != "" || r.ToolCalls != nil:
		return evidence.SignalNone
	case r.Error != nil:
		if s := errSignal(r.Error); s != evidence.SignalNone {
			return s
		}
		return evidence.SignalEmptyResponse
	case r.FinishReason == "content_filter":
		// Nothing came back because the filter took it: falling back to
		// another route would only route around the filter.
		return evidence.SignalContentFiltered
	default:
		return evidence.SignalEmptyResponse
	}
}

// firstChoice returns the choice with index 0, or the first one.
func firstChoice(raw json.RawMessage) (wireChoice, bool) {
	choices := arr(raw)
	var first wireChoice
	found := false
	for _, c := range choices {
		var ch wireChoice
		if !obj(c, &ch) {
			continue
		}
		if i, ok := num(ch.Index); !ok || i == 0 {
			return ch, true
		}
		if !found {
			first, found = ch, true
		}
	}
	return first, found
}

// toolCallsOf returns a message's tool calls verbatim, nil when none; a
// legacy function_call is wrapped as a one-element tool-call list.
func toolCallsOf(calls, fn json.RawMessage) json.RawMessage {
	if t := bytes.TrimSpace(calls); len(arr(t)) > 0 {
		return json.RawMessage(t)
	}
	if t := bytes.TrimSpace(fn); len(t) > 0 && t[0] == '{' {
		out, err := json.Marshal([]struct {
			Type     string          `json:"type"`
			Function json.RawMessage `json:"function"`
		}{{Type: "function", Function: t}})
		if err == nil {
			return out
		}
	}
	return nil
}

// parseErrorBody reads the body of an HTTP error status: the error object
// ({"error": {...}}, {"error": "..."}, a top-level error object, or the
// first element of an array of those) and the signal it maps to. A body
// that is not JSON maps to no signal; it is never an error.
func parseErrorBody(data []byte) (providers.Response, evidence.Signal) {
	t := bytes.TrimSpace(data)
	if len(t) == 0 || !json.Valid(t) {
		return providers.Response{}, evidence.SignalNone
	}
	r := providers.Response{Raw: json.RawMessage(t)}
	v := json.RawMessage(t)
	if t[0] == '[' {
		if els := arr(t); len(els) > 0 {
			v = els[0]
		}
	}
	var b wireBody
	if obj(v, &b) {
		r.ID, r.Model = str(b.ID), str(b.Model)
		r.Error = parseAPIError(b.Error)
	}
	if r.Error == nil {
		var w wireError
		if obj(v, &w) && (str(w.Code) != "" || str(w.Type) != "") {
			r.Error = &providers.APIError{Type: str(w.Type), Code: str(w.Code), Param: str(w.Param), Message: str(w.Message)}
		}
	}
	return r, errorSignal(r.Error)
}
