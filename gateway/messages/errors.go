package messages

import (
	"encoding/json"
	"net/http"

	"github.com/durallm/durallm/gateway/answer"
)

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
	typeBilling        = "billing_error"
)

// anthropicTypes are the error types Anthropic's API and SDKs know
// (anthropic-sdk-go: shared.ErrorType).
var anthropicTypes = map[string]bool{
	typeInvalidRequest: true, typeAuthentication: true, typeBilling: true, typePermission: true,
	typeNotFound: true, typeTooLarge: true, typeRateLimit: true, "timeout_error": true,
	typeAPI: true, typeOverloaded: true, typeConflict: true,
}

// The error codes (error.details.error_code, anthropic-sdk-go:
// Error.ErrorCode) of durallm's own causes, when the problem names none.
const (
	CodeAwaitingReconciliation = "durallm_awaiting_reconciliation"
	CodeMaybeStarted           = "durallm_maybe_started"
	CodeIndeterminate          = "durallm_indeterminate"
	CodeCanceled               = "durallm_canceled"
	CodeInProgress             = "durallm_in_progress"
	CodeFailed                 = "durallm_failed"
	CodeSpendExhausted         = "spend_exhausted"
	CodeUpstreamAuth           = "durallm_upstream_auth"
	CodeStreamIncomplete       = "durallm_stream_incomplete"
	CodeContentFilter          = "content_filter"
	CodeKeyReused              = "idempotency_key_reused"
	CodeRequestTimeout         = "request_timeout"
	CodeCallerLimit            = "max_in_flight"
	CodeUnavailable            = "temporal_unreachable"
	CodeNotImplemented         = "durallm_not_implemented"
)

// shapes are each kind's status, error type and the code it says when the
// problem names none. Rejected and ContentFiltered are the provider's
// (wireErrorOf); a kind not listed is the gateway's own error, 500.
//
// A kind whose action may have run (answer.Kind.MayHaveRun) is a 403, which
// no client of the Messages API resends by default, whether or not it
// reads x-should-retry: the Anthropic SDKs obey x-should-retry: false
// before the status, but @ai-sdk/anthropic resends 408, 409, 429 and 5xx
// without reading it, and @langchain/anthropic every status but 400 to
// 407, 409 and 413 (docs/gateway.md). Its type is conflict_error, the
// Anthropic type that says the request conflicts with the state of what it
// names; the code says which state.
var shapes = answer.Shapes{
	answer.InvalidRequest:            {Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: ""},
	answer.Unauthorized:              {Status: http.StatusUnauthorized, Type: typeAuthentication, Code: ""},
	answer.Forbidden:                 {Status: http.StatusForbidden, Type: typePermission, Code: ""},
	answer.NotFound:                  {Status: http.StatusNotFound, Type: typeNotFound, Code: ""},
	answer.ModelNotFound:             {Status: http.StatusNotFound, Type: typeNotFound, Code: ""},
	answer.MethodNotAllowed:          {Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest, Code: ""},
	answer.UnsupportedMediaType:      {Status: http.StatusUnsupportedMediaType, Type: typeInvalidRequest, Code: ""},
	answer.NotImplemented:            {Status: http.StatusNotImplemented, Type: typeAPI, Code: CodeNotImplemented},
	answer.TooLarge:                  {Status: http.StatusRequestEntityTooLarge, Type: typeTooLarge, Code: ""},
	answer.RequestTimeout:            {Status: http.StatusRequestTimeout, Type: typeInvalidRequest, Code: CodeRequestTimeout},
	answer.KeyReused:                 {Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: CodeKeyReused},
	answer.CallerLimit:               {Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: CodeCallerLimit},
	answer.UnavailableNothingStarted: {Status: 529, Type: typeOverloaded, Code: CodeUnavailable},
	answer.MaybeStarted:              {Status: http.StatusForbidden, Type: typeConflict, Code: CodeMaybeStarted},
	answer.UpstreamAuth:              {Status: http.StatusBadGateway, Type: typeAPI, Code: CodeUpstreamAuth},
	answer.Failed:                    {Status: http.StatusBadGateway, Type: typeAPI, Code: CodeFailed},
	// The action's own budget: Anthropic's billing_error, which none of
	// the clients resends (a resend would be a new action with a new
	// budget).
	answer.SpendExhausted:  {Status: http.StatusPaymentRequired, Type: typeBilling, Code: CodeSpendExhausted},
	answer.AwaitingVerdict: {Status: http.StatusForbidden, Type: typeConflict, Code: CodeAwaitingReconciliation},
	answer.Indeterminate:   {Status: http.StatusForbidden, Type: typeConflict, Code: CodeIndeterminate},
	answer.Canceled:        {Status: http.StatusForbidden, Type: typeConflict, Code: CodeCanceled},
	answer.InProgress:      {Status: http.StatusForbidden, Type: typeConflict, Code: CodeInProgress},
	// Only ever in-band, after the stream's 200, where its type is
	// api_error; a status would be one that nobody resends.
	answer.StreamIncomplete: {Status: http.StatusForbidden, Type: typeAPI, Code: CodeStreamIncomplete},
	answer.Conflict:         {Status: http.StatusConflict, Type: typeConflict, Code: ""},
}

// wireError is a problem as the Messages API answers it.
type wireError struct {
	status             int
	typ, message, code string
}

// wireErrorOf is p's status, type, message and code. The message is p's,
// prefixed with the member it names (as Anthropic's say
// "messages.0.content: ..."), or the provider's own for a rejection. The
// code (error.details.error_code) is the problem's, else the kind's.
func wireErrorOf(p answer.Problem) wireError {
	e := wireError{message: p.Message, code: p.Code}
	if p.Param != "" {
		e.message = p.Param + ": " + e.message
	}
	switch p.Kind {
	case answer.Rejected:
		// The provider's status as a caller acts on it, its type when
		// Anthropic's, its message and code.
		e.status, e.message = p.RejectedStatus(), p.ProviderMessage()
		e.typ = typeForStatus(e.status)
		if pe := p.ProviderError; pe != nil {
			if anthropicTypes[pe.Type] {
				e.typ = pe.Type
			}
			if pe.Code != "" {
				e.code = pe.Code
			}
		}
		return e
	case answer.ContentFiltered:
		e.status, e.typ, e.code, e.message = http.StatusBadRequest, typeInvalidRequest, CodeContentFilter, p.ProviderMessage()
		return e
	case answer.Unauthorized:
		// How the Anthropic clients send their key.
		e.message = "missing or unknown API key: send a token of the gateway's tokens file as x-api-key: <token> or Authorization: Bearer <token> " +
			"(ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN)"
	}
	sh := shapes.Of(p, answer.Shape{Status: http.StatusInternalServerError, Type: typeAPI})
	e.status, e.typ, e.code = sh.Status, sh.Type, sh.Code
	if e.message == "" {
		e.message = string(p.Kind)
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

// render is p as the Messages API's error answer: Anthropic's error
// object, {"type": "error", "error": {"type", "message", "details":
// {"error_code"}}}, with its status and the headers every surface's error
// answer carries (answer.Problem.Header: x-should-retry, which both
// Anthropic SDKs obey before the status, Retry-After, Allow).
func render(p answer.Problem) answer.Rendered {
	e := wireErrorOf(p)
	return answer.Rendered{Status: e.status, Header: p.Header(), Body: append(e.json(), '\n')}
}

// errorEvent is p as one in-band server-sent event, for a stream whose
// 200 went out: "event: error", which both Anthropic SDKs raise as an
// error (an event without its event: line they silently skip). It is not
// numbered: it is always sent, also to a reader that resumes after it.
func errorEvent(p answer.Problem) answer.Event {
	return answer.Event{Name: "error", Data: wireErrorOf(p).json()}
}

func (e wireError) json() []byte {
	type details struct {
		ErrorCode string `json:"error_code"`
	}
	type object struct {
		Type    string   `json:"type"`
		Message string   `json:"message"`
		Details *details `json:"details,omitempty"`
	}
	o := object{Type: e.typ, Message: e.message}
	if e.code != "" {
		o.Details = &details{ErrorCode: e.code}
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
