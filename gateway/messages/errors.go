package messages

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Kind is what went wrong with a request, in words that do not depend on
// the API surface: the gateway's core decides the kind (from its refusals
// before any start and from an ended action's outcome, docs/contract.md
// section 6.5), and each surface renders it in its own wire format.
type Kind string

// The kinds, with the answer ErrorFor gives each on the Messages API. "no
// retry" means x-should-retry: false, which both Anthropic SDKs obey
// before the status (see the package documentation).
const (
	// KindInvalidRequest: the request is wrong; nothing started. 400
	// invalid_request_error, naming the member (Problem.Param).
	KindInvalidRequest Kind = "invalid_request"
	// KindUnauthenticated: no key, or not one of the gateway's. 401
	// authentication_error.
	KindUnauthenticated Kind = "unauthenticated"
	// KindForbidden: the caller may not do this. 403 permission_error.
	KindForbidden Kind = "forbidden"
	// KindNotFound: no such model (for this caller), action or endpoint.
	// 404 not_found_error.
	KindNotFound Kind = "not_found"
	// KindTooLarge: the body, or the action's input, is too large. 413
	// request_too_large.
	KindTooLarge Kind = "too_large"
	// KindKeyReused: the Idempotency-Key names an action started with
	// another body; nothing started. 422 invalid_request_error.
	KindKeyReused Kind = "idempotency_key_reused"
	// KindCallerLimit: the caller's max_in_flight; nothing started. 429
	// rate_limit_error, Retry-After, x-should-retry: true.
	KindCallerLimit Kind = "caller_limit"
	// KindUnavailable: Temporal is not reachable; nothing started. 529
	// overloaded_error, Retry-After, x-should-retry: true.
	KindUnavailable Kind = "unavailable"
	// KindNotImplemented: an endpoint the gateway does not serve
	// (count_tokens). 501 api_error, no retry.
	KindNotImplemented Kind = "not_implemented"
	// KindRejected: the provider rejected the request (the action ended
	// rejected). Problem.Status is the answer's status as the core keeps
	// the provider's (400, 404, 413, 422; else 400), with the provider's
	// own error type when it is one of Anthropic's and its message.
	KindRejected Kind = "rejected"
	// KindContentFiltered: a provider's content filter (rejected). 400
	// invalid_request_error.
	KindContentFiltered Kind = "content_filtered"
	// KindUpstreamAuth: the provider refused the route's key (a 401 or 403
	// upstream): the gateway's to fix, not the caller's. 502 api_error.
	KindUpstreamAuth Kind = "upstream_auth"
	// KindFailed: no provider could answer (the action failed). 502
	// api_error, Retry-After when the last attempt was throttled, no
	// retry: a new request starts a new action.
	KindFailed Kind = "failed"
	// KindAwaitingVerdict: an attempt may have run at the provider and its
	// answer was lost; the action waits for a verdict. 409 conflict_error,
	// no retry.
	KindAwaitingVerdict Kind = "awaiting_verdict"
	// KindMaybeStarted: the action started, or may have, and its answer
	// cannot be given now (still running past the gateway's wait, or its
	// result could not be read). 409 conflict_error, no retry: a resend
	// without the same Idempotency-Key would run it again.
	KindMaybeStarted Kind = "maybe_started"
	// KindIndeterminate: the action ended and nobody can tell whether the
	// provider ran it. 409 conflict_error, no retry.
	KindIndeterminate Kind = "indeterminate"
	// KindCanceled: the action was canceled (Problem.Reason: the origin).
	// 409 conflict_error, no retry.
	KindCanceled Kind = "canceled"
	// KindIncomplete: a stream cut after its content started
	// (completed_partial; Problem.Reason says why). Only ever in-band, an
	// error event after the last delta: api_error.
	KindIncomplete Kind = "incomplete"
	// KindInternal: the gateway itself failed. 500 api_error, no retry:
	// the action may have started.
	KindInternal Kind = "internal"
)

// Problem is one kind of failure with what its answer says.
type Problem struct {
	Kind Kind
	// Status is the answer's status for KindRejected; ignored otherwise.
	Status int
	// Reason is an identifier saying why, in the contract's words: the
	// failed or indeterminate action's reason, a cancel's origin, why a
	// stream was cut. Never content.
	Reason string
	// Param names the request member at fault (KindInvalidRequest), in
	// Anthropic's dotted form: "messages.0.content.1.source".
	Param string
	// Message replaces the kind's own explanation: for KindRejected the
	// provider's own message, which may quote the prompt and so goes only
	// to the caller who sent the request.
	Message string
	// ProviderType is the provider's error type (KindRejected).
	ProviderType string
	// ActionID and Attempt name the action and the attempt a verdict is
	// awaited for (KindAwaitingVerdict).
	ActionID string
	Attempt  int
	// RetryAfter, when positive, is sent as Retry-After.
	RetryAfter time.Duration
}

// Error is an answer in Anthropic's error shape, {"type": "error",
// "error": {"type", "message", "details": {"error_code"}}}, with its
// status and headers. Its message never holds a prompt, an answer, a
// token or a key, except a provider's own error message passed back to the
// caller who sent the request.
type Error struct {
	// Status is the HTTP status (unused in-band).
	Status int
	// Type is one of Anthropic's error types.
	Type string
	// Message says what happened and what to do.
	Message string
	// Code is error.details.error_code, durallm's name for the cause, which
	// anthropic-sdk-go returns from Error.ErrorCode; "" for none.
	Code string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up).
	RetryAfter time.Duration
	// Retry is what x-should-retry says.
	Retry bool
}

// Anthropic's error types that the gateway sends; a provider's own type is
// passed back when it is one of anthropicTypes.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typePermission     = "permission_error"
	typeNotFound       = "not_found_error"
	typeTooLarge       = "request_too_large"
	typeRateLimit      = "rate_limit_error"
	typeAPI            = "api_error"
	typeOverloaded     = "overloaded_error"
	typeConflict       = "conflict_error"
)

// anthropicTypes are the error types Anthropic's API and SDKs know.
var anthropicTypes = map[string]bool{
	typeInvalidRequest: true, typeAuthentication: true, "billing_error": true, typePermission: true,
	typeNotFound: true, typeTooLarge: true, typeRateLimit: true, "timeout_error": true,
	typeAPI: true, typeOverloaded: true, typeConflict: true,
}

// The error codes (error.details.error_code) of durallm's own causes.
const (
	CodeAwaitingReconciliation = "durallm_awaiting_reconciliation"
	CodeMaybeStarted           = "durallm_maybe_started"
	CodeIndeterminate          = "durallm_indeterminate"
	CodeCanceled               = "durallm_canceled"
	CodeFailed                 = "durallm_failed"
	CodeUpstreamAuth           = "durallm_upstream_auth"
	CodeStreamIncomplete       = "durallm_stream_incomplete"
	CodeContentFilter          = "content_filter"
	CodeKeyReused              = "idempotency_key_reused"
	CodeCallerLimit            = "max_in_flight"
	CodeUnavailable            = "temporal_unreachable"
	CodeNotImplemented         = "durallm_not_implemented"
)

// ErrorFor is the Messages API's answer to p.
func ErrorFor(p Problem) *Error {
	e := &Error{Message: p.Message, RetryAfter: p.RetryAfter}
	def := func(status int, typ, code, msg string) {
		e.Status, e.Type, e.Code = status, typ, code
		if e.Message == "" {
			e.Message = msg
		}
	}
	switch p.Kind {
	case KindInvalidRequest:
		def(http.StatusBadRequest, typeInvalidRequest, "", "the request is invalid")
		if p.Param != "" {
			e.Message = p.Param + ": " + e.Message
		}
	case KindUnauthenticated:
		def(http.StatusUnauthorized, typeAuthentication, "", "missing or unknown API key: send x-api-key: <token> (or Authorization: Bearer <token>) with a token of the gateway's tokens file")
	case KindForbidden:
		def(http.StatusForbidden, typePermission, "", "this key may not do that")
	case KindNotFound:
		def(http.StatusNotFound, typeNotFound, "", "not found")
	case KindTooLarge:
		def(http.StatusRequestEntityTooLarge, typeTooLarge, "", "the request is too large")
	case KindKeyReused:
		def(http.StatusUnprocessableEntity, typeInvalidRequest, CodeKeyReused, "this Idempotency-Key was used with another request body; use a new key for a new request")
	case KindCallerLimit:
		def(http.StatusTooManyRequests, typeRateLimit, CodeCallerLimit, "you have as many requests in progress as your max_in_flight; nothing was started")
		e.Retry = true
	case KindUnavailable:
		def(529, typeOverloaded, CodeUnavailable, "Temporal is not reachable; nothing was started")
		e.Retry = true
	case KindNotImplemented:
		def(http.StatusNotImplemented, typeAPI, CodeNotImplemented, "not implemented by durallm's gateway")
	case KindRejected:
		e.Status, e.Code = http.StatusBadRequest, p.Reason
		switch p.Status {
		case http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
			e.Status = p.Status
		}
		e.Type = typeForStatus(e.Status)
		if anthropicTypes[p.ProviderType] {
			e.Type = p.ProviderType
		}
		if e.Message == "" {
			e.Message = "the provider rejected the request (" + p.Reason + ")"
		}
	case KindContentFiltered:
		def(http.StatusBadRequest, typeInvalidRequest, CodeContentFilter, "the provider's content filter refused the request or its answer")
	case KindUpstreamAuth:
		def(http.StatusBadGateway, typeAPI, CodeUpstreamAuth, "the provider refused the gateway's credentials for the route ("+p.Reason+"): the route's key, not yours, needs fixing")
	case KindFailed:
		def(http.StatusBadGateway, typeAPI, CodeFailed, "no provider could answer: the action failed ("+p.Reason+"); sending the request again starts a new action")
	case KindAwaitingVerdict:
		n := strconv.Itoa(p.Attempt)
		def(http.StatusConflict, typeConflict, CodeAwaitingReconciliation,
			"attempt "+n+" of action "+p.ActionID+" may have run at the provider and its answer was lost, so it is not sent again: "+
				"an operator settles it (POST /v1/actions/"+p.ActionID+"/reconcile, or 'durallm reconcile "+p.ActionID+" --attempt "+n+
				" --verdict completed|not_executed|allow_replay|abandon'); the same Idempotency-Key then gets the verdict's answer")
	case KindMaybeStarted:
		def(http.StatusConflict, typeConflict, CodeMaybeStarted,
			"the action started and its answer cannot be given now ("+p.Reason+"): GET /v1/actions/"+p.ActionID+
				" later, or send the request again with the same Idempotency-Key; without it, sending it again runs it again")
	case KindIndeterminate:
		def(http.StatusConflict, typeConflict, CodeIndeterminate,
			"the action ended indeterminate ("+p.Reason+"): the provider may have run the request and nobody can tell; sending it again may run it twice")
	case KindCanceled:
		def(http.StatusConflict, typeConflict, CodeCanceled, "the action was canceled ("+p.Reason+")")
	case KindIncomplete:
		def(http.StatusOK, typeAPI, CodeStreamIncomplete,
			"the answer was cut after it started ("+p.Reason+"): what arrived is all there is, and no second answer follows")
	default:
		def(http.StatusInternalServerError, typeAPI, "", "the gateway failed; the action may have started")
	}
	return e
}

// typeForStatus is Anthropic's error type for a 4xx status.
func typeForStatus(status int) string {
	switch status {
	case http.StatusNotFound:
		return typeNotFound
	case http.StatusRequestEntityTooLarge:
		return typeTooLarge
	}
	return typeInvalidRequest
}

func (e *Error) Error() string { return e.Type + ": " + e.Message }

// Body is the error as Anthropic sends it, with a newline.
func (e *Error) Body() []byte {
	return append(e.json(), '\n')
}

func (e *Error) json() []byte {
	type details struct {
		ErrorCode string `json:"error_code"`
	}
	type object struct {
		Type    string   `json:"type"`
		Message string   `json:"message"`
		Details *details `json:"details,omitempty"`
	}
	o := object{Type: e.Type, Message: e.Message}
	if e.Code != "" {
		o.Details = &details{ErrorCode: e.Code}
	}
	b, err := json.Marshal(struct {
		Type  string `json:"type"`
		Error object `json:"error"`
	}{"error", o})
	if err != nil {
		// Only strings go in.
		return []byte(`{"type":"error","error":{"type":"api_error","message":"internal error"}}`)
	}
	return b
}

// Event is the error as one in-band server-sent event, for a stream whose
// 200 went out already: "event: error", which every Anthropic SDK raises
// as an error (an event without its event: line they silently skip).
func (e *Error) Event() []byte {
	return frame(nil, "error", e.json())
}

// SetHeaders sets x-should-retry (every non-2xx answer has it) and
// Retry-After on h.
func (e *Error) SetHeaders(h http.Header) {
	h.Set("X-Should-Retry", strconv.FormatBool(e.Retry))
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10))
	}
}

// Write answers e: its status, headers and body.
func (e *Error) Write(w http.ResponseWriter) {
	h := w.Header()
	e.SetHeaders(h)
	h.Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.Body())
}

// frame appends one server-sent event, "event: name" then its data, to
// dst. Every event has its event: line: the Anthropic SDKs skip one that
// has none.
func frame(dst []byte, name string, data []byte) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, name...)
	dst = append(dst, "\ndata: "...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}
