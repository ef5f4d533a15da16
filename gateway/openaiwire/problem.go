// Package openaiwire renders what the OpenAI-shaped surfaces of the
// gateway share: a Problem (package gateway/answer) as OpenAI's error
// object, {"error": {"message", "type", "param", "code"}}, with its status
// and the headers the OpenAI SDKs read (x-should-retry, Retry-After). The
// chat-completions surface (package gateway/chat) renders its problems
// through it; the Responses surface (package gateway/responses) embeds
// Door, which reads the key and renders the problems as every surface of
// the OpenAI family does.
package openaiwire

import (
	"encoding/json"
	"net/http"

	"github.com/durallm/durallm/gateway/answer"
)

// The error types the gateway itself sends (a provider's own type is
// passed back as it is).
const (
	TypeInvalidRequest   = "invalid_request_error"
	TypeRateLimit        = "rate_limit_error"
	TypeUnavailable      = "durallm_unavailable"
	TypeMaybeStarted     = "durallm_maybe_started"
	TypeFailed           = "durallm_failed"
	TypeUpstreamAuth     = "durallm_upstream_auth"
	TypeAwaiting         = "durallm_awaiting_reconciliation"
	TypeIndeterminate    = "durallm_indeterminate"
	TypeCanceled         = "durallm_canceled"
	TypeInProgress       = "durallm_in_progress"
	TypeStreamIncomplete = "durallm_stream_incomplete"
	TypeServer           = "durallm_gateway_error"
	// TypeInsufficientQuota is OpenAI's type (and code) for a spent
	// quota: the action's own budget.
	TypeInsufficientQuota = "insufficient_quota"
)

// The codes the gateway itself sends when the problem names none.
const (
	CodeInvalidValue          = "invalid_value"
	CodeInvalidAPIKey         = "invalid_api_key"
	CodeNotFound              = "not_found"
	CodeModelNotFound         = "model_not_found"
	CodeMethodNotAllowed      = "method_not_allowed"
	CodeUnsupportedMediaType  = "unsupported_media_type"
	CodeNotImplemented        = "not_implemented"
	CodeRequestTooLarge       = "request_too_large"
	CodeRequestTimeout        = "request_timeout"
	CodeIdempotencyKeyReused  = "idempotency_key_reused"
	CodeCallerLimit           = "max_in_flight"
	CodeTemporalUnreachable   = "temporal_unreachable"
	CodeContentFilter         = "content_filter"
	CodeAwaitingReconcilation = "awaiting_reconciliation"
	CodeStillRunning          = "still_running"
)

// Render is p as OpenAI's error answer. Every non-2xx answer carries
// x-should-retry: true only for a problem whose request may be sent again
// whatever it carried (answer.Kind.Resendable), false otherwise, which the
// OpenAI and Anthropic SDKs obey before the status.
func Render(p answer.Problem) answer.Rendered {
	status, e := shape(p)
	h := p.Header()
	if p.Kind == answer.Unauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="durallm gateway"`)
	}
	return answer.Rendered{Status: status, Header: h, Body: Body(e)}
}

// Object is OpenAI's error object.
type Object struct {
	Message string
	Type    string
	Param   string
	Code    string
}

// ErrorObject is p's error object, as Render's body holds it and as an
// in-band stream error carries it.
func ErrorObject(p answer.Problem) Object {
	_, e := shape(p)
	return e
}

// Status is the HTTP status of p's answer.
func Status(p answer.Problem) int {
	s, _ := shape(p)
	return s
}

// shapes are each kind's status, error type and the code it says when
// the problem names none. Rejected and ContentFiltered are the provider's
// (rejected); a kind not listed is the gateway's own error.
//
// A kind whose action may have run (answer.Kind.MayHaveRun) is a 403,
// the one status that no common client resends by default whether or
// not it reads x-should-retry: the Stainless SDKs resend 408, 409, 429
// and 5xx, the AI SDK the same without reading the header, LangChain
// every status but 400 to 407, 409 and 413 (docs/gateway.md). RFC 9110
// says of a 403 that the client should not repeat it as it stands.
var shapes = answer.Shapes{
	answer.InvalidRequest:            {Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: CodeInvalidValue},
	answer.Unauthorized:              {Status: http.StatusUnauthorized, Type: TypeInvalidRequest, Code: CodeInvalidAPIKey},
	answer.Forbidden:                 {Status: http.StatusForbidden, Type: TypeInvalidRequest, Code: "forbidden"},
	answer.NotFound:                  {Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: CodeNotFound},
	answer.ModelNotFound:             {Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: CodeModelNotFound},
	answer.MethodNotAllowed:          {Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest, Code: CodeMethodNotAllowed},
	answer.UnsupportedMediaType:      {Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest, Code: CodeUnsupportedMediaType},
	answer.NotImplemented:            {Status: http.StatusNotImplemented, Type: TypeInvalidRequest, Code: CodeNotImplemented},
	answer.TooLarge:                  {Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Code: CodeRequestTooLarge},
	answer.RequestTimeout:            {Status: http.StatusRequestTimeout, Type: TypeInvalidRequest, Code: CodeRequestTimeout},
	answer.KeyReused:                 {Status: http.StatusUnprocessableEntity, Type: TypeInvalidRequest, Code: CodeIdempotencyKeyReused},
	answer.CallerLimit:               {Status: http.StatusTooManyRequests, Type: TypeRateLimit, Code: CodeCallerLimit},
	answer.UnavailableNothingStarted: {Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: CodeTemporalUnreachable},
	answer.MaybeStarted:              {Status: http.StatusForbidden, Type: TypeMaybeStarted, Code: CodeTemporalUnreachable},
	answer.UpstreamAuth:              {Status: http.StatusBadGateway, Type: TypeUpstreamAuth, Code: ""},
	answer.Failed:                    {Status: http.StatusBadGateway, Type: TypeFailed, Code: ""},
	answer.SpendExhausted:            {Status: http.StatusTooManyRequests, Type: TypeInsufficientQuota, Code: TypeInsufficientQuota},
	answer.AwaitingVerdict:           {Status: http.StatusForbidden, Type: TypeAwaiting, Code: CodeAwaitingReconcilation},
	answer.Indeterminate:             {Status: http.StatusForbidden, Type: TypeIndeterminate, Code: ""},
	answer.Canceled:                  {Status: http.StatusForbidden, Type: TypeCanceled, Code: ""},
	answer.InProgress:                {Status: http.StatusForbidden, Type: TypeInProgress, Code: CodeStillRunning},
	answer.StreamIncomplete:          {Status: http.StatusBadGateway, Type: TypeStreamIncomplete, Code: ""},
	answer.Conflict:                  {Status: http.StatusConflict, Type: TypeInvalidRequest, Code: ""},
}

// shape is p's status and error object.
func shape(p answer.Problem) (int, Object) {
	e := Object{Message: p.Message, Param: p.Param, Code: p.Code}
	switch p.Kind {
	case answer.Rejected:
		return rejected(p, e)
	case answer.ContentFiltered:
		e.Type, e.Code, e.Message = TypeInvalidRequest, CodeContentFilter, p.ProviderMessage()
		return http.StatusBadRequest, e
	}
	sh := shapes.Of(p, answer.Shape{Status: http.StatusInternalServerError, Type: TypeServer})
	e.Type, e.Code = sh.Type, sh.Code
	return sh.Status, e
}

// rejected is the provider's own status and error object: 400, 404, 413
// and 422 as the provider sent them, any other status as 400.
func rejected(p answer.Problem, e Object) (int, Object) {
	e.Type, e.Message = TypeInvalidRequest, p.ProviderMessage()
	if pe := p.ProviderError; pe != nil {
		if pe.Type != "" {
			e.Type = pe.Type
		}
		e.Code, e.Param = pe.Code, pe.Param
	}
	return p.RejectedStatus(), e
}

// Body is {"error": e} as JSON, with a newline; an empty param or code is
// null, as OpenAI sends them.
func Body(e Object) []byte {
	type wire struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	orNull := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	b, err := json.Marshal(struct {
		Error wire `json:"error"`
	}{wire{Message: e.Message, Type: e.Type, Param: orNull(e.Param), Code: orNull(e.Code)}})
	if err != nil {
		// Only strings go in.
		return []byte(`{"error":{"message":"internal error","type":"durallm_gateway_error"}}` + "\n")
	}
	return append(b, '\n')
}

// Door is what every surface of the OpenAI family answers alike, for a
// surface to embed: the API key as the OpenAI SDKs send it, a bearer token
// (answer.BearerToken), and a problem as OpenAI's error answer (Render).
type Door struct{}

// Credential is the bearer token of the Authorization header.
func (Door) Credential(r *http.Request) (string, bool) {
	return answer.BearerToken(r.Header.Get("Authorization"))
}

// Problem is OpenAI's error answer (Render).
func (Door) Problem(p answer.Problem) answer.Rendered { return Render(p) }
