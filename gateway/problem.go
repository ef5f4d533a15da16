package gateway

import (
	"fmt"
	"net/http"
	"time"

	"github.com/durallm/durallm/gateway/answer"
)

// writeProblem answers p as the surface renders it.
func writeProblem(w http.ResponseWriter, s answer.Surface, p *answer.Problem) {
	rd := s.Problem(*p)
	h := w.Header()
	for k, v := range rd.Header {
		h[k] = v
	}
	w.WriteHeader(rd.Status)
	_, _ = w.Write(rd.Body)
}

// badRequest is an invalid request naming the field.
func badRequest(param, message string) *answer.Problem {
	return &answer.Problem{Kind: answer.InvalidRequest, Param: param, Message: message}
}

// modelNotFound is the answer for a model the gateway does not serve, or
// one the caller may not use: the same, so that nobody learns which.
func modelNotFound() *answer.Problem {
	return &answer.Problem{Kind: answer.ModelNotFound, Param: "model",
		Message: "the model does not exist or you do not have access to it (GET /v1/models lists yours)"}
}

// noSuchAction is the answer about an action that does not exist or is
// another caller's: the same, so that nobody learns which.
func noSuchAction() *answer.Problem {
	return &answer.Problem{Kind: answer.NotFound, Message: "no such action"}
}

// temporalUnreachable is the refusal of a request that started nothing
// because Temporal could not be reached.
func temporalUnreachable(message string) *answer.Problem {
	return &answer.Problem{Kind: answer.UnavailableNothingStarted, RetryAfter: time.Second, Message: message}
}

// callerLimit is the refusal of a caller that has max_in_flight requests
// in progress; done says what the refused request did not do.
func callerLimit(c Caller, done string) *answer.Problem {
	return &answer.Problem{Kind: answer.CallerLimit, RetryAfter: time.Second,
		Message: fmt.Sprintf("you have %d requests in progress (streams and waits), your max_in_flight; %s", c.MaxInFlight, done)}
}
