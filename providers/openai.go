package providers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// CallOpenAI makes one attempt against an OpenAI-compatible
// chat-completions endpoint: one POST to {BaseURL}/chat/completions with
// rt.RoundTrip, never retried.
//
// ctx should carry the attempt (recovery.WithAttempt), created with
// Spec.ManualCommit: CallOpenAI commits it exactly when the first content
// (text, refusal or tool-call delta) is handed on, never on keep-alives or
// role-only chunks; for a non-streaming 2xx, once the body is read, parsed
// and found usable. ManualCommit is required for a stream and advisable
// for a non-streaming request too: without it the engine commits on the
// first body byte, so a JSON body cut halfway classifies as
// committed_partial (with nothing usable) rather than ambiguous.
//
// How it ends:
//   - The provider answered (any status, body read): Result with the
//     Response and the Signal, nil error. HTTP error statuses are not
//     errors: the caller classifies from the evidence plus the Signal.
//   - A 2xx body that is not JSON, or passes MaxResponseBytes: Result with
//     SignalEmptyResponse and an error (ErrMalformedResponse,
//     ErrResponseTooLarge).
//   - A stream that fails before its first content (timer, reset, cut,
//     over-long line): an error wrapping the cause (ErrFirstByteTimeout,
//     ErrIdleTimeout, ErrLineTooLong, the transport's error, ...), and the
//     Signal when the body said something (an error event, or
//     SignalEmptyResponse for a malformed stream).
//   - A stream that fails after its first content: Result with
//     Response.Partial, Response.Incomplete naming why, the text so far,
//     and nil error; Sink.Incomplete is called. If the caller's context
//     was canceled, the error wrapping context.Canceled is returned too.
//   - The send failed: the transport's error, wrapped.
//
// Errors never contain the prompt, the output, headers or the key.
func CallOpenAI(ctx context.Context, rt http.RoundTripper, c Call) (Result, error) {
	return call(ctx, rt, c, &openaiDialect)
}

// openaiDialect is the chat-completions API.
var openaiDialect = dialect{
	kind: KindOpenAI,
	path: []string{"chat", "completions"},
	body: requestBody,
	auth: func(h http.Header, key string) {
		if key != "" {
			h.Set("Authorization", "Bearer "+key)
		}
	},
	whole:     parseCompletion,
	errorBody: parseErrorBody,
	newStream: newStreamAcc,
	signal:    errorSignal,
}

// requestBody flattens the envelope into OpenAI's request shape: the
// params at top level, then the envelope's own members over them.
func requestBody(model string, r Request) ([]byte, error) {
	m := make(map[string]json.RawMessage, len(r.Params)+7)
	for k, v := range r.Params {
		m[k] = v
	}
	put := func(k string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode %s: %w", k, err)
		}
		m[k] = b
		return nil
	}
	if err := put("model", model); err != nil {
		return nil, err
	}
	if err := put("messages", r.Messages); err != nil {
		return nil, err
	}
	if len(r.Tools) > 0 {
		if err := put("tools", r.Tools); err != nil {
			return nil, err
		}
	}
	if len(r.ToolChoice) > 0 {
		m["tool_choice"] = r.ToolChoice
	}
	if len(r.ResponseFormat) > 0 {
		m["response_format"] = r.ResponseFormat
	}
	if r.Stream {
		m["stream"] = json.RawMessage("true")
		if _, ok := m["stream_options"]; !ok {
			// Without it OpenAI sends no usage on a stream.
			m["stream_options"] = json.RawMessage(`{"include_usage":true}`)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	return b, nil
}
