package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// apiError is an error in OpenAI's shape, {"error": {...}}, with the
// status and headers of its answer. Its message never holds a prompt, an
// answer, a token or a key, except a provider's own error message passed
// back to the caller who sent the request.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up).
	RetryAfter time.Duration
	// Retry is what x-should-retry says: true only for the 429 and 503
	// refusals before anything started.
	Retry bool
}

// The error types the gateway itself sends (a provider's own type is
// passed back as it is).
const (
	typeInvalidRequest        = "invalid_request_error"
	typeRateLimit             = "rate_limit_error"
	typeUnavailable           = "durallm_unavailable"
	typeFailed                = "durallm_failed"
	typeUpstreamAuth          = "durallm_upstream_auth"
	typeAwaiting              = "durallm_awaiting_reconciliation"
	typeIndeterminate         = "durallm_indeterminate"
	typeCanceled              = "durallm_canceled"
	typeInProgress            = "durallm_in_progress"
	typeStreamIncomplete      = "durallm_stream_incomplete"
	typeServer                = "durallm_gateway_error"
	typeInsufficientQuota     = "insufficient_quota"
	codeInvalidAPIKey         = "invalid_api_key"
	codeModelNotFound         = "model_not_found"
	codeUnsupportedEndpoint   = "unsupported_endpoint"
	codeNotFound              = "not_found"
	codeContentFilter         = "content_filter"
	codeIdempotencyKeyReused  = "idempotency_key_reused"
	codeRequestTooLarge       = "request_too_large"
	codeInvalidValue          = "invalid_value"
	codeCallerLimit           = "max_in_flight"
	codeTemporalUnreachable   = "temporal_unreachable"
	codeMethodNotAllowed      = "method_not_allowed"
	codeOperatorOnly          = "operator_only"
	codeStillRunning          = "still_running"
	codeAwaitingReconcilation = "awaiting_reconciliation"
)

func (e *apiError) Error() string { return e.Type + ": " + e.Message }

// badRequest is a 400 naming the field.
func badRequest(param, message string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Param: param, Code: codeInvalidValue, Message: message}
}

// writeError answers e: its status, x-should-retry, Retry-After and the
// body {"error": e}.
func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	setRetryHeaders(h, e)
	h.Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(errorBody(e))
}

// setRetryHeaders sets x-should-retry (every non-2xx answer has it) and
// Retry-After.
func setRetryHeaders(h http.Header, e *apiError) {
	h.Set("X-Should-Retry", strconv.FormatBool(e.Retry))
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10))
	}
}

// errorBody is {"error": e} as JSON, with a newline; an empty param or
// code is null, as OpenAI sends them.
func errorBody(e *apiError) []byte {
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
