package providers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
)

// Request is one model request in the OpenAI chat-completions shape. It is
// what the workflow carries in its input, so it holds no route, URL or key:
// the route supplies the model name and the credentials at call time.
type Request struct {
	// Messages is the conversation, oldest first. Required.
	Messages []Message `json:"messages"`
	// Tools are OpenAI tool definitions, passed through verbatim.
	// Default: none.
	Tools []json.RawMessage `json:"tools,omitempty"`
	// ToolChoice is OpenAI's tool_choice ("auto", "none", "required" or an
	// object), passed through verbatim. Default: omitted.
	ToolChoice json.RawMessage `json:"tool_choice,omitempty"`
	// ResponseFormat is OpenAI's response_format (a structured output
	// schema), passed through verbatim. Default: omitted.
	ResponseFormat json.RawMessage `json:"response_format,omitempty"`
	// Stream asks for a server-sent-event stream. Default false.
	Stream bool `json:"stream,omitempty"`
	// Params holds every other top-level member (temperature, max_tokens,
	// top_p, seed, stream_options, ...), merged into the request body
	// verbatim. The members the envelope owns (see ReservedParams) may not
	// appear here. Default: none.
	Params map[string]json.RawMessage `json:"params,omitempty"`
}

// Needs returns the capabilities the request itself uses: tools when it
// declares any, structured_output for a json_schema response_format,
// vision for an image content part, streaming when it asks for a stream.
// A route that lacks one cannot serve the request, so the workflow adds
// these to what the action declares. It is deterministic, so workflow
// code may call it.
func (r Request) Needs() Capabilities {
	n := Capabilities{Tools: len(r.Tools) > 0, Streaming: r.Stream}
	// Only the "type" members matter; a member of another shape is no
	// evidence of a need, and Validate, not this, judges the request.
	var typed struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(r.ResponseFormat, &typed) == nil && typed.Type == "json_schema" {
		n.StructuredOutput = true
	}
	for _, m := range r.Messages {
		if trimmed := bytes.TrimLeft(m.Content, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '[' {
			// A string (the most common content, and the largest): no
			// image, and no need to scan it.
			continue
		}
		var parts []json.RawMessage
		if json.Unmarshal(m.Content, &parts) != nil {
			continue // not parts: no image
		}
		for _, part := range parts {
			typed.Type = ""
			if json.Unmarshal(part, &typed) == nil && (typed.Type == "image_url" || typed.Type == "image" || typed.Type == "input_image") {
				n.Vision = true
			}
		}
	}
	return n
}

// Message is one chat message. Content is kept verbatim so that text,
// image parts and provider-specific parts all pass through unchanged.
type Message struct {
	// Role is "system", "developer", "user", "assistant" or "tool".
	// Required.
	Role string `json:"role"`
	// Content is a JSON string or an array of content parts, verbatim.
	// Empty means omitted (an assistant message carrying only tool calls).
	Content json.RawMessage `json:"content,omitempty"`
	// Name is the optional participant name. Default: omitted.
	Name string `json:"name,omitempty"`
	// ToolCalls are an assistant message's tool calls, verbatim.
	// Default: omitted.
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
	// ToolCallID names the call a "tool" message answers. Default: omitted.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// TextMessage returns a message whose content is the JSON string text.
func TextMessage(role, text string) Message {
	// Marshalling a string cannot fail.
	b, _ := json.Marshal(text)
	return Message{Role: role, Content: b}
}

// ReservedParams are the top-level members the envelope itself writes;
// Request.Params may not set them, so a parameter can never silently
// replace the route's model or the conversation.
var ReservedParams = []string{"messages", "model", "response_format", "stream", "tool_choice", "tools"}

// ErrInvalidRequest is wrapped by every error Request.Validate returns.
var ErrInvalidRequest = errors.New("providers: invalid request")

// Validate reports every problem of r at once (joined with errors.Join),
// each wrapping ErrInvalidRequest and naming the bad field, such as
// "messages[2].role". The messages never quote the field's value: a value
// may be part of a prompt.
func (r Request) Validate() error {
	var errs []error
	bad := func(field, problem string) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidRequest, field, problem))
	}
	rawOK := func(field string, raw json.RawMessage) {
		if len(raw) > 0 && !ValidJSON(raw) {
			bad(field, "invalid JSON")
		}
	}
	if len(r.Messages) == 0 {
		bad("messages", "empty")
	}
	for i, m := range r.Messages {
		field := "messages[" + strconv.Itoa(i) + "]"
		if m.Role == "" {
			bad(field+".role", "empty")
		}
		rawOK(field+".content", m.Content)
		rawOK(field+".tool_calls", m.ToolCalls)
	}
	for i, t := range r.Tools {
		field := "tools[" + strconv.Itoa(i) + "]"
		if len(t) == 0 {
			bad(field, "empty")
			continue
		}
		rawOK(field, t)
	}
	rawOK("tool_choice", r.ToolChoice)
	rawOK("response_format", r.ResponseFormat)
	keys := make([]string, 0, len(r.Params))
	for k := range r.Params {
		keys = append(keys, k)
	}
	// Sorted so the joined error reads the same on every run.
	sort.Strings(keys)
	for _, k := range keys {
		field := "params[" + strconv.Quote(k) + "]"
		if isReserved(k) {
			bad(field, "reserved: set it through the request's own field")
			continue
		}
		v := r.Params[k]
		if len(v) == 0 {
			bad(field, "empty")
			continue
		}
		rawOK(field, v)
	}
	return errors.Join(errs...)
}

func isReserved(k string) bool {
	for _, r := range ReservedParams {
		if k == r {
			return true
		}
	}
	return false
}

// Response is one attempt's answer, normalised from whatever the provider
// sent. It is content: it may be stored in workflow history (which can be
// encrypted) but never logged.
type Response struct {
	// ID is the provider's response id, empty when it sent none.
	ID string `json:"id,omitempty"`
	// Model is the model the provider says answered.
	Model string `json:"model,omitempty"`
	// FinishReason is the first choice's finish_reason ("stop", "length",
	// "tool_calls", "content_filter", ...), empty when none arrived.
	FinishReason string `json:"finish_reason,omitempty"`
	// Status is the body's status member ("queued", "in_progress", ...)
	// when it carried one, kept for the operator: it never makes an
	// answer without content usable.
	Status string `json:"status,omitempty"`
	// Text is the first choice's assistant content, concatenated (text
	// parts of an array content are joined).
	Text string `json:"text,omitempty"`
	// Refusal is the first choice's refusal text, empty when none.
	Refusal string `json:"refusal,omitempty"`
	// ToolCalls are the first choice's tool calls: verbatim for a
	// non-streaming body, assembled from the deltas for a stream. Nil when
	// none.
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
	// Usage is the token accounting, zero when the provider sent none.
	Usage Usage `json:"usage"`
	// Partial reports that the stream ended after content started without
	// completing; Text, Refusal and ToolCalls hold what arrived.
	Partial bool `json:"partial,omitempty"`
	// Incomplete says why a partial stream ended (one of the Incomplete*
	// constants); empty when the response is complete.
	Incomplete string `json:"incomplete,omitempty"`
	// Error is the provider's error object, when the body carried one
	// (an HTTP error status, or an error event in a stream). Nil otherwise.
	Error *APIError `json:"error,omitempty"`
	// Raw is the provider's whole body for a non-streaming response,
	// unknown members preserved; nil for a stream or a body that is not
	// JSON.
	Raw json.RawMessage `json:"raw,omitempty"`
	// Pieces records the pieces the answer was streamed to its
	// subscribers in (see Pieces); empty when nothing streamed.
	Pieces Pieces `json:"pieces,omitempty"`
}

// Usage is the token accounting of one response. Counts the provider sent
// as strings or floats are normalised to integers.
type Usage struct {
	// PromptTokens is usage.prompt_tokens (or input_tokens).
	PromptTokens int `json:"prompt_tokens,omitempty"`
	// CompletionTokens is usage.completion_tokens (or output_tokens).
	CompletionTokens int `json:"completion_tokens,omitempty"`
	// TotalTokens is usage.total_tokens, or the sum of the two above when
	// the provider sent none.
	TotalTokens int `json:"total_tokens,omitempty"`
	// CachedTokens are the prompt tokens read from the provider's prompt
	// cache (OpenAI's usage.prompt_tokens_details.cached_tokens,
	// Anthropic's cache_read_input_tokens); part of PromptTokens.
	CachedTokens int `json:"cached_tokens,omitempty"`
	// CacheWriteTokens are the prompt tokens written to the provider's
	// prompt cache (Anthropic's cache_creation_input_tokens); part of
	// PromptTokens.
	CacheWriteTokens int `json:"cache_write_tokens,omitempty"`
}

// Reported reports whether the provider sent any token count.
func (u Usage) Reported() bool {
	return u.PromptTokens > 0 || u.CompletionTokens > 0 || u.TotalTokens > 0
}

// Tokens is what the usage counts against a token budget: prompt plus
// completion tokens, or the total when the provider's total is larger
// (a total sent without its parts).
func (u Usage) Tokens() int {
	return max(u.TotalTokens, u.PromptTokens+u.CompletionTokens)
}

// Add returns the sum of u and o, member by member.
func (u Usage) Add(o Usage) Usage {
	return Usage{
		PromptTokens: u.PromptTokens + o.PromptTokens, CompletionTokens: u.CompletionTokens + o.CompletionTokens,
		TotalTokens: u.TotalTokens + o.TotalTokens, CachedTokens: u.CachedTokens + o.CachedTokens,
		CacheWriteTokens: u.CacheWriteTokens + o.CacheWriteTokens,
	}
}

// APIError is an OpenAI-style error object as the provider sent it. The
// Message may quote the prompt, so it is content like Response.Text: it
// never goes into a Go error, a log or a metric. Type, Code and Param are
// the provider's identifiers and are safe to record.
type APIError struct {
	// Type is error.type, e.g. "invalid_request_error".
	Type string `json:"type,omitempty"`
	// Code is error.code, e.g. "model_not_found"; a numeric code is kept
	// as its digits.
	Code string `json:"code,omitempty"`
	// Param is error.param, the request member the provider objected to.
	Param string `json:"param,omitempty"`
	// Message is error.message (or a bare string error): content.
	Message string `json:"message,omitempty"`
}

// Why a partial stream ended: the values of Response.Incomplete and of the
// reason given to Sink.Incomplete.
const (
	// IncompleteReset: the provider reset the stream (RST_STREAM).
	IncompleteReset = "reset"
	// IncompleteConnectionClosed: the connection ended under the stream.
	IncompleteConnectionClosed = "connection_closed"
	// IncompleteGoAway: the provider sent GOAWAY and dropped the stream.
	IncompleteGoAway = "goaway"
	// IncompleteIdleTimeout: no byte arrived for the route's IdleTimeout.
	IncompleteIdleTimeout = "idle_timeout"
	// IncompleteAttemptTimeout: the route's AttemptTimeout ran out.
	IncompleteAttemptTimeout = "attempt_timeout"
	// IncompleteDeadline: the caller's context deadline passed.
	IncompleteDeadline = "deadline_exceeded"
	// IncompleteCanceled: the caller's context was canceled (with any
	// cause other than a timeout).
	IncompleteCanceled = "canceled"
	// IncompleteTruncated: the body ended cleanly but without [DONE] or a
	// finish_reason.
	IncompleteTruncated = "truncated"
	// IncompleteTooLarge: the accumulated answer passed MaxResponseBytes.
	IncompleteTooLarge = "too_large"
	// IncompleteLineTooLong: an SSE line passed MaxSSELineBytes.
	IncompleteLineTooLong = "line_too_long"
	// IncompleteEventTooLarge: one SSE event's data passed MaxSSELineBytes.
	IncompleteEventTooLarge = "event_too_large"
	// IncompleteMalformed: an SSE event's data was not JSON.
	IncompleteMalformed = "malformed_event"
	// IncompleteProviderError: the stream carried an error event.
	IncompleteProviderError = "provider_error"
	// IncompleteReadError: the body failed for a reason the evidence does
	// not name.
	IncompleteReadError = "read_error"
	// IncompleteTimeout: a timer of the caller's ended the stream (its
	// context was canceled with a cause wrapping recovery.ErrTimedOut).
	IncompleteTimeout = "timeout"
	// IncompleteWorkerLost: the worker running the stream was lost after
	// content started; the text it delivered is not in the record.
	IncompleteWorkerLost = "worker_lost"
)
