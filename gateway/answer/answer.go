// Package answer describes what durallm's gateway answers, apart from any
// wire format. The gateway's core decides, in one place, which answer an
// action's outcome gets and says it with these types: a Problem when the
// request gets no answer (its Kind, never a status), an Answer when the
// action ended with one, and the Deltas of a streamed answer. Each front
// door (package gateway/chat for OpenAI chat completions, and any other
// surface) renders them in its own API's shape, statuses and headers;
// none of them decides anything about an action.
//
// The package is a leaf: it imports only the envelope (package
// providers), so a surface links no Temporal, no engine and no core.
package answer

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/durallm/durallm/providers"
)

// Kind is what a Problem is, in the gateway's words. A surface maps each
// kind to its API's status and error type; the kinds keep apart what
// docs/contract.md section 6.5 keeps apart.
type Kind string

// The kinds of problem. The comment says what the request learned; the
// status each surface gives it is in docs/gateway.md.
const (
	// InvalidRequest: the request is malformed (Param names the field).
	// Nothing was started.
	InvalidRequest Kind = "invalid_request"
	// Unauthorized: no token, or one the gateway does not know.
	Unauthorized Kind = "unauthorized"
	// Forbidden: the caller may not do this (an operator's endpoint).
	Forbidden Kind = "forbidden"
	// NotFound: no such action (or another caller's), or no such
	// endpoint (Code says which).
	NotFound Kind = "not_found"
	// ModelNotFound: the request names a model the gateway does not
	// serve, or one the caller may not use.
	ModelNotFound Kind = "model_not_found"
	// MethodNotAllowed: the endpoint takes another method (Message names
	// it).
	MethodNotAllowed Kind = "method_not_allowed"
	// UnsupportedMediaType: a body that is not JSON by its Content-Type.
	UnsupportedMediaType Kind = "unsupported_media_type"
	// NotImplemented: an endpoint of the surface's API that the gateway
	// knows and does not serve (Message says why). Nothing was started.
	NotImplemented Kind = "not_implemented"
	// TooLarge: the body is over the gateway's bound or Temporal's
	// payload limit. Nothing was started.
	TooLarge Kind = "too_large"
	// RequestTimeout: the body did not arrive in time. Nothing was
	// started; sending it again is safe.
	RequestTimeout Kind = "request_timeout"
	// KeyReused: the Idempotency-Key names an action started with
	// another body. Nothing was started.
	KeyReused Kind = "key_reused"
	// CallerLimit: the caller has max_in_flight requests in progress.
	// Nothing was started; sending it again later is safe.
	CallerLimit Kind = "caller_limit"
	// UnavailableNothingStarted: Temporal could not be reached and no
	// action was started. Sending it again is safe.
	UnavailableNothingStarted Kind = "unavailable_nothing_started"
	// MaybeStarted: the start, or the wait for the result, failed after
	// Temporal may have accepted the action: it may run. Sending the
	// request again without its key would run it twice.
	MaybeStarted Kind = "maybe_started"
	// Rejected: the provider rejected the request (ProviderStatus,
	// ProviderError). It ran no model.
	Rejected Kind = "rejected"
	// ContentFiltered: the provider's content filter refused it.
	ContentFiltered Kind = "content_filtered"
	// UpstreamAuth: the provider refused the route's credentials (the
	// gateway's key, not the caller's).
	UpstreamAuth Kind = "upstream_auth"
	// Failed: no provider could answer (Code is the reason).
	Failed Kind = "failed"
	// SpendExhausted: the action's own budget is spent; its next
	// attempt was not sent. Not a provider's failure, and not to be sent
	// again as it is.
	SpendExhausted Kind = "spend_exhausted"
	// AwaitingVerdict: an attempt may have run at the provider and its
	// answer was lost; the action waits for a verdict.
	AwaitingVerdict Kind = "awaiting_verdict"
	// Indeterminate: the action ended without anyone telling whether
	// the provider ran it.
	Indeterminate Kind = "indeterminate"
	// Canceled: the action was canceled (Code is the origin).
	Canceled Kind = "canceled"
	// InProgress: the action still runs (a wait reached its bound).
	InProgress Kind = "in_progress"
	// StreamIncomplete: a streamed answer was cut after it started (Code
	// says why); only ever in-band, after the stream's 200.
	StreamIncomplete Kind = "stream_incomplete"
	// Conflict: the action's state refuses the operation (it ended; a
	// verdict was refused: Code says why).
	Conflict Kind = "conflict"
	// Internal: the gateway itself failed.
	Internal Kind = "internal"
)

// Resendable reports whether sending the same request again is safe
// whether or not it carried an Idempotency-Key: only when nothing was
// started (the caller's limit, Temporal unreachable, a body that came too
// slowly). A surface whose
// clients read a retry hint (x-should-retry) sets it from this, and gives
// every other kind a status its clients do not retry by default.
func (k Kind) Resendable() bool {
	return k == CallerLimit || k == UnavailableNothingStarted || k == RequestTimeout
}

// MayHaveRun reports whether the request's action may have run at a
// provider, so that a resend without its key could run the model again:
// these kinds must have a status that no common client retries by
// default (docs/gateway.md lists the clients and their rules).
func (k Kind) MayHaveRun() bool {
	switch k {
	case MaybeStarted, AwaitingVerdict, Indeterminate, Canceled, InProgress, StreamIncomplete:
		return true
	}
	return false
}

// Problem is why a request gets no answer. Its Message is meant for the
// caller and never holds a prompt, an answer, a token or a key, except a
// provider's own error message passed back to the caller who sent the
// request (ProviderError).
type Problem struct {
	Kind Kind
	// Message says what happened and what to do.
	Message string
	// Param names the request's field at fault, "" for none.
	Param string
	// Code refines the kind: the reason of a failure, the origin of a
	// cancel, why a stream was cut. "" for none.
	Code string
	// RetryAfter, when positive, is how long to wait before sending the
	// request again (a caller limit, Temporal unreachable, a failure
	// after throttling).
	RetryAfter time.Duration
	// ProviderStatus is, for Rejected, the HTTP status the provider
	// answered; 0 when the request was refused before it was sent.
	ProviderStatus int
	// ProviderError is, for Rejected and ContentFiltered, the provider's
	// own error object; nil when it sent none.
	ProviderError *providers.APIError
	// Allow is, for MethodNotAllowed, the method the endpoint takes.
	Allow string
}

// Error reports the problem's kind and message.
func (p *Problem) Error() string { return string(p.Kind) + ": " + p.Message }

// Identity is what every rendering of one action's answer shares: its id
// is the action id, and Created and Model are what the action was started
// with (kept in its memo), so a replay renders the same bytes.
type Identity struct {
	ID      string
	Created int64
	Model   string
	// Kept is what the surface kept of the request (Request.Keep), nil
	// for none.
	Kept []byte
}

// Answer is an ended action's answer: completed, reconciled, or
// completed_partial (Incomplete says why it was cut).
type Answer struct {
	Identity
	// Response is the action's response; never nil (an action that
	// ended without one answers an empty response).
	Response *providers.Response
	// Incomplete is, for a completed_partial answer, why it was cut; ""
	// for a whole answer.
	Incomplete string
}

// ProviderBody is the provider's own body of the answer r, as the action
// kept it, when the route spoke the surface's API (is judges its members):
// passed on with every member the provider sent, those of set replaced
// (the action id, the model the request named, ...), encoded as it came
// (no HTML escaping) with a newline. ok is false for a partial answer, an
// answer without a body, and a body is refuses: the surface then builds
// its answer from the envelope.
func ProviderBody(r *providers.Response, is func(members map[string]json.RawMessage) bool, set map[string]any) (_ []byte, ok bool) {
	if len(r.Raw) == 0 || r.Partial {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(r.Raw, &m) != nil || m == nil || !is(m) {
		return nil, false
	}
	for k, v := range set {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, false
		}
		m[k] = b
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if enc.Encode(m) != nil {
		return nil, false
	}
	return out.Bytes(), true
}

// DeltaKind says what a Delta carries.
type DeltaKind int

// The kinds of delta, as a streamed answer carries them.
const (
	// Text is a piece of generated text.
	Text DeltaKind = iota + 1
	// Refusal is a piece of the model's refusal.
	Refusal
	// ToolCall is a piece of a tool call.
	ToolCall
)

// Delta is one piece of a streamed answer's content. The core hands a
// stream encoder the action's deltas in order, each once, from the first,
// whether they come live from a worker or are rebuilt from the action's
// result, so an encoder that is a function of what it was fed numbers its
// events the same on every gateway.
type Delta struct {
	Kind DeltaKind
	// Text is the piece of text or refusal (Text, Refusal).
	Text string
	// ToolCall is the piece of a tool call (ToolCall).
	ToolCall ToolCallDelta
}

// ToolCallDelta is one piece of a tool call. Index is the call's position
// among the answer's tool calls, from 0; ID, Type and Name come on the
// call's first piece, and Arguments are concatenated in order.
type ToolCallDelta struct {
	Index     int
	ID        string
	Type      string
	Name      string
	Arguments string
}

// Event is one server-sent event of a surface's stream.
type Event struct {
	// Numbered says the event has a place in the stream's sequence
	// (Seq), as the surface counts: a resumed stream (starting_after=N)
	// skips the numbered events with Seq up to N. An event that is not
	// numbered (an end marker such as chat's [DONE], an in-band error)
	// is always sent.
	Numbered bool
	Seq      uint64
	// ID is the SSE "id:" line, "" for none.
	ID string
	// Name is the SSE "event:" line, "" for none.
	Name string
	// Data is the "data:" line's payload, one line of JSON (or a marker
	// such as [DONE]).
	Data []byte
}
