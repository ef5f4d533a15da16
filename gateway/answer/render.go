package answer

import (
	"net/http"
	"strconv"
	"time"
)

// What every surface's rendering of a problem shares, whatever its API's
// error object: the headers, the status of a rejection, the provider's
// message, and a table of each kind's status, type and code.

// Shape is how a surface answers one kind of problem: its HTTP status,
// its error type, and the code it says when the problem names none.
type Shape struct {
	Status     int
	Type, Code string
}

// Shapes are a surface's shapes, by kind.
type Shapes map[Kind]Shape

// Of is p's shape in s: its kind's (def for a kind s does not list), with
// the code p names in place of the kind's.
func (s Shapes) Of(p Problem, def Shape) Shape {
	sh, ok := s[p.Kind]
	if !ok {
		sh = def
	}
	if p.Code != "" {
		sh.Code = p.Code
	}
	return sh
}

// Header is what every error answer carries: Content-Type
// application/json; x-should-retry, true only for a problem whose request
// may be sent again whatever it carried (Kind.Resendable), false
// otherwise, which the Stainless SDKs (OpenAI's and Anthropic's) obey
// before the status; Retry-After in whole seconds, rounded up, when
// RetryAfter is set; and Allow for MethodNotAllowed.
func (p Problem) Header() http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", strconv.FormatBool(p.Kind.Resendable()))
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10))
	}
	if p.Kind == MethodNotAllowed && p.Allow != "" {
		h.Set("Allow", p.Allow)
	}
	return h
}

// RejectedStatus is the status of a Rejected answer: the provider's when
// a caller acts on it as the provider meant it (400, 404, 413, 422), any
// other as 400 (a provider's 401 or 403 is UpstreamAuth instead).
func (p Problem) RejectedStatus() int {
	switch p.ProviderStatus {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return p.ProviderStatus
	}
	return http.StatusBadRequest
}

// ProviderMessage is the provider's own message, for a rejection or a
// content filter, else Message. The provider's may quote the prompt: it
// goes only to the caller who sent the request.
func (p Problem) ProviderMessage() string {
	if pe := p.ProviderError; pe != nil && pe.Message != "" {
		return pe.Message
	}
	return p.Message
}
