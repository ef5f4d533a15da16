package messages

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

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
)

// anthropicTypes are the error types Anthropic's API and SDKs know
// (anthropic-sdk-go: shared.ErrorType).
var anthropicTypes = map[string]bool{
	typeInvalidRequest: true, typeAuthentication: true, "billing_error": true, typePermission: true,
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
	CodeUpstreamAuth           = "durallm_upstream_auth"
	CodeStreamIncomplete       = "durallm_stream_incomplete"
	CodeContentFilter          = "content_filter"
	CodeKeyReused              = "idempotency_key_reused"
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
var shapes = map[answer.Kind]struct {
	status    int
	typ, code string
}{
	answer.InvalidRequest:            {http.StatusBadRequest, typeInvalidRequest, ""},
	answer.Unauthorized:              {http.StatusUnauthorized, typeAuthentication, ""},
	answer.Forbidden:                 {http.StatusForbidden, typePermission, ""},
	answer.NotFound:                  {http.StatusNotFound, typeNotFound, ""},
	answer.ModelNotFound:             {http.StatusNotFound, typeNotFound, ""},
	answer.MethodNotAllowed:          {http.StatusMethodNotAllowed, typeInvalidRequest, ""},
	answer.UnsupportedMediaType:      {http.StatusUnsupportedMediaType, typeInvalidRequest, ""},
	answer.NotImplemented:            {http.StatusNotImplemented, typeAPI, CodeNotImplemented},
	answer.TooLarge:                  {http.StatusRequestEntityTooLarge, typeTooLarge, ""},
	answer.KeyReused:                 {http.StatusUnprocessableEntity, typeInvalidRequest, CodeKeyReused},
	answer.CallerLimit:               {http.StatusTooManyRequests, typeRateLimit, CodeCallerLimit},
	answer.UnavailableNothingStarted: {529, typeOverloaded, CodeUnavailable},
	answer.MaybeStarted:              {http.StatusForbidden, typeConflict, CodeMaybeStarted},
	answer.UpstreamAuth:              {http.StatusBadGateway, typeAPI, CodeUpstreamAuth},
	answer.Failed:                    {http.StatusBadGateway, typeAPI, CodeFailed},
	answer.AwaitingVerdict:           {http.StatusForbidden, typeConflict, CodeAwaitingReconciliation},
	answer.Indeterminate:             {http.StatusForbidden, typeConflict, CodeIndeterminate},
	answer.Canceled:                  {http.StatusForbidden, typeConflict, CodeCanceled},
	answer.InProgress:                {http.StatusForbidden, typeConflict, CodeInProgress},
	// Only ever in-band, after the stream's 200, where its type is
	// api_error; a status would be one that nobody resends.
	answer.StreamIncomplete: {http.StatusForbidden, typeAPI, CodeStreamIncomplete},
	answer.Conflict:         {http.StatusConflict, typeConflict, ""},
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
		// The provider's status when it is one a caller acts on (400,
		// 404, 413, 422), its type when Anthropic's, its message and code.
		e.status = http.StatusBadRequest
		switch p.ProviderStatus {
		case http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
			e.status = p.ProviderStatus
		}
		e.typ = typeForStatus(e.status)
		if pe := p.ProviderError; pe != nil {
			if anthropicTypes[pe.Type] {
				e.typ = pe.Type
			}
			if pe.Message != "" {
				e.message = pe.Message
			}
			if pe.Code != "" {
				e.code = pe.Code
			}
		}
		return e
	case answer.ContentFiltered:
		e.status, e.typ, e.code = http.StatusBadRequest, typeInvalidRequest, CodeContentFilter
		if pe := p.ProviderError; pe != nil && pe.Message != "" {
			e.message = pe.Message
		}
		return e
	}
	sh, ok := shapes[p.Kind]
	if !ok {
		sh.status, sh.typ = http.StatusInternalServerError, typeAPI
	}
	e.status, e.typ = sh.status, sh.typ
	if e.code == "" {
		e.code = sh.code
	}
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
// {"error_code"}}}, with its status, and x-should-retry, which both
// Anthropic SDKs obey before the status: true only for a problem whose
// request may be sent again whatever it carried (answer.Kind.Resendable),
// false otherwise.
func render(p answer.Problem) answer.Rendered {
	e := wireErrorOf(p)
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", strconv.FormatBool(p.Kind.Resendable()))
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10))
	}
	if p.Kind == answer.MethodNotAllowed && p.Allow != "" {
		h.Set("Allow", p.Allow)
	}
	return answer.Rendered{Status: e.status, Header: h, Body: append(e.json(), '\n')}
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
