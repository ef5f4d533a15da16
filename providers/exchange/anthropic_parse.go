package exchange

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

// The Messages wire shapes, every member raw like the chat-completions
// ones (parse.go), so drifted types never fail a decode.
type wireAnthropicMessage struct {
	ID         json.RawMessage `json:"id"`
	Model      json.RawMessage `json:"model"`
	Content    json.RawMessage `json:"content"`
	StopReason json.RawMessage `json:"stop_reason"`
	Usage      json.RawMessage `json:"usage"`
	Error      json.RawMessage `json:"error"`
}

// wireAnthropicBlock is a content block, or an event's delta (which
// shares the members that matter).
type wireAnthropicBlock struct {
	Type        json.RawMessage `json:"type"`
	Text        json.RawMessage `json:"text"`
	ID          json.RawMessage `json:"id"`
	Name        json.RawMessage `json:"name"`
	Input       json.RawMessage `json:"input"`
	PartialJSON json.RawMessage `json:"partial_json"`
	StopReason  json.RawMessage `json:"stop_reason"`
}

type wireAnthropicEvent struct {
	Type         json.RawMessage `json:"type"`
	Index        json.RawMessage `json:"index"`
	Message      json.RawMessage `json:"message"`
	ContentBlock json.RawMessage `json:"content_block"`
	Delta        json.RawMessage `json:"delta"`
	Usage        json.RawMessage `json:"usage"`
	Error        json.RawMessage `json:"error"`
}

type wireAnthropicUsage struct {
	InputTokens   json.RawMessage `json:"input_tokens"`
	OutputTokens  json.RawMessage `json:"output_tokens"`
	CacheCreation json.RawMessage `json:"cache_creation_input_tokens"`
	CacheRead     json.RawMessage `json:"cache_read_input_tokens"`
}

// anthropicUsage is Anthropic's token accounting, merged across a
// stream's events: message_start carries the input side, message_delta
// the cumulative output (and, from newer API versions, the input again).
type anthropicUsage struct {
	input, output, cacheWrite, cacheRead int
}

// merge applies the counts present in raw, reporting whether raw was a
// usage object.
func (u *anthropicUsage) merge(raw json.RawMessage) bool {
	var w wireAnthropicUsage
	if !obj(raw, &w) {
		return false
	}
	for _, f := range []struct {
		raw json.RawMessage
		dst *int
	}{{w.InputTokens, &u.input}, {w.OutputTokens, &u.output}, {w.CacheCreation, &u.cacheWrite}, {w.CacheRead, &u.cacheRead}} {
		if n, ok := num(f.raw); ok {
			*f.dst = n
		}
	}
	return true
}

// usage counts cache reads and writes as prompt tokens: Anthropic's
// input_tokens excludes them, OpenAI's prompt_tokens includes cached
// tokens, and one Usage should mean the same whichever route answered.
// Reads and writes are kept apart too, as Anthropic prices them apart.
func (u anthropicUsage) usage() providers.Usage {
	p := u.input + u.cacheWrite + u.cacheRead
	return providers.Usage{PromptTokens: p, CompletionTokens: u.output, TotalTokens: p + u.output,
		CachedTokens: u.cacheRead, CacheWriteTokens: u.cacheWrite}
}

// toolArgs renders a tool_use input as OpenAI's arguments text: compact
// JSON, "{}" when absent, a string verbatim (a proxy that encoded it
// already).
// emptyInput is a tool call's empty input, which Anthropic's stream
// sends in a tool_use block's start whether or not its input streams next.
const emptyInput = "{}"

func toolArgs(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	switch {
	case isNull(t):
		return "{}"
	case t[0] == '"':
		return str(t)
	}
	var b bytes.Buffer
	if json.Compact(&b, t) != nil {
		return string(t)
	}
	return b.String()
}

// parseAnthropicMessage reads a 2xx Messages body generously, with
// parseCompletion's contract: only a body that is not JSON, or is cut
// mid-value, is an error.
func parseAnthropicMessage(data []byte) (providers.Response, evidence.Signal, error) {
	var b wireAnthropicMessage
	r, ok, err := decodeBody(data, &b)
	if !ok {
		return r, unreadSignal(err), err
	}
	r.ID, r.Model = str(b.ID), str(b.Model)
	r.FinishReason = AnthropicFinishReason(str(b.StopReason))
	var u anthropicUsage
	if u.merge(b.Usage) {
		r.Usage = u.usage()
	}
	r.Error = parseAPIError(b.Error)
	r.Text, r.ToolCalls = contentText(b.Content), AnthropicToolCalls(b.Content)
	return r, completionSignalWith(r, anthropicErrorSignal), nil
}

// parseAnthropicError reads the body of an HTTP error status:
// {"type": "error", "error": {"type": ..., "message": ...}} (or any shape
// parseErrorBody reads), mapped with anthropicErrorSignal.
func parseAnthropicError(data []byte) (providers.Response, evidence.Signal) {
	r, _ := parseErrorBody(data)
	return r, anthropicErrorSignal(r.Error)
}

// anthropicErrorSignal maps an Anthropic error object to a signal: first
// whatever errorSignal recognises (overloaded_error among them), then
// not_found_error as the model (the only resource a Messages request
// names; a base URL with a wrong path lands here too, and that route
// cannot serve either, so falling back is right), rate_limit_error as
// overloaded (it matters in a stream's error event, where the status
// is 200), and a prompt too long for the context window. Error messages
// are read for that last case only, never copied anywhere.
func anthropicErrorSignal(e *providers.APIError) evidence.Signal {
	if s := errorSignal(e); s != evidence.SignalNone || e == nil {
		return s
	}
	switch strings.ToLower(e.Type) {
	case "not_found_error":
		return evidence.SignalModelNotFound
	case "rate_limit_error":
		return evidence.SignalOverloaded
	}
	msg := strings.ToLower(e.Message)
	if strings.Contains(msg, "prompt is too long") || strings.Contains(msg, "exceed context limit") {
		return evidence.SignalContextTooLong
	}
	return evidence.SignalNone
}

// anthropicEvents reads a Messages event stream into a streamAcc: text
// deltas as text, a tool_use block's start and its input_json_delta
// pieces as tool-call deltas keyed by the block index, message_delta's
// stop_reason as the finish reason, message_stop as the end marker.
type anthropicEvents struct {
	usage anthropicUsage
}

// newAnthropicStreamAcc returns an accumulator for a Messages stream.
func newAnthropicStreamAcc() *streamAcc {
	a := newStreamAcc()
	a.reader = &anthropicEvents{}
	return a
}

func (e *anthropicEvents) read(a *streamAcc, name string, data []byte) (text string, first bool, err error) {
	t, err := a.payload(data)
	if t == nil || err != nil {
		return "", false, err
	}
	var ev wireAnthropicEvent
	if !obj(t, &ev) {
		return "", false, nil
	}
	typ := str(ev.Type)
	if typ == "" {
		// A proxy that kept the SSE event name but not the member.
		typ = name
	}
	if typ == "error" || name == "error" || !isNull(ev.Error) {
		e := eventError(t, ev.Error)
		if e.Type == "error" {
			// A flattened error object whose type is the event's own.
			e.Type = ""
		}
		return "", false, a.fail(e)
	}
	var deltas []toolDelta
	var finish string
	var b wireAnthropicBlock
	switch typ {
	case "message_start":
		var m wireAnthropicMessage
		if obj(ev.Message, &m) {
			if a.resp.ID == "" {
				a.resp.ID = str(m.ID)
			}
			if a.resp.Model == "" {
				a.resp.Model = str(m.Model)
			}
			if e.usage.merge(m.Usage) {
				a.resp.Usage, a.gotUsage = e.usage.usage(), true
			}
		}
	case "content_block_start":
		if !obj(ev.ContentBlock, &b) {
			break
		}
		switch str(b.Type) {
		case "text":
			text = str(b.Text)
		case "tool_use":
			d := toolDelta{id: str(b.ID), typ: "function", name: str(b.Name), startArgs: toolArgs(b.Input)}
			d.index, d.hasIndex = num(ev.Index)
			deltas = append(deltas, d)
		}
	case "content_block_delta":
		if !obj(ev.Delta, &b) {
			break
		}
		switch str(b.Type) {
		case "text_delta":
			text = str(b.Text)
		case "input_json_delta":
			d := toolDelta{args: str(b.PartialJSON)}
			d.index, d.hasIndex = num(ev.Index)
			deltas = append(deltas, d)
		}
	case "content_block_stop":
		// A tool call whose start said only {} and whose input streamed
		// no piece has that empty input: it is streamed now, once.
		if i, ok := num(ev.Index); ok {
			if c := a.byIndex[i]; c != nil && c.args.Len() == 0 && c.startArgs == emptyInput {
				deltas = append(deltas, toolDelta{index: i, hasIndex: true, args: emptyInput})
			}
		}
	case "message_delta":
		if obj(ev.Delta, &b) {
			finish = AnthropicFinishReason(str(b.StopReason))
		}
		if e.usage.merge(ev.Usage) {
			a.resp.Usage, a.gotUsage = e.usage.usage(), true
		}
	case "message_stop":
		a.done = true
	}
	// ping, thinking and citation deltas carry nothing for the caller
	// and fall through to an empty apply.
	first, err = a.apply(text, "", deltas, finish)
	if err != nil {
		return "", false, err
	}
	return text, first, nil
}
