package gateway

import (
	"net/http"
	"strconv"

	"github.com/durallm/durallm/workflows"
)

// outcome is how an ended action answers its caller (docs/contract.md
// section 6.5): a 200 with the answer (marked incomplete for a partial
// one), or an error that keeps the states apart.
type outcome struct {
	// OK: the answer is the response (completed, completed_partial,
	// reconciled).
	OK bool
	// Incomplete is why a completed_partial answer was cut.
	Incomplete string
	// Err is the answer otherwise.
	Err *apiError
}

// The classes an ended action's outcome may name that decide the answer.
// They are the contract's words (docs/contract.md section 3.1), compared as
// the strings ActionResult.Outcome carries.
const (
	classContentFiltered = "content_filtered"
	classThrottled       = "throttled"
)

// outcomeOf maps a terminal result to its answer. res must be terminal.
func outcomeOf(res workflows.ActionResult) outcome {
	switch res.State {
	case workflows.StateCompleted, workflows.StateReconciled:
		return outcome{OK: true}
	case workflows.StateCompletedPartial:
		reason := "truncated"
		if res.Response != nil && res.Response.Incomplete != "" {
			reason = res.Response.Incomplete
		}
		return outcome{OK: true, Incomplete: reason}
	case workflows.StateRejected:
		return outcome{Err: rejectedError(res)}
	case workflows.StateFailed:
		e := &apiError{Status: http.StatusBadGateway, Type: typeFailed, Code: res.Reason,
			Message: "no provider could answer: the action failed (" + res.Reason + "); retrying it now starts a new action"}
		if last, ok := lastAttempt(res); ok && res.Outcome == classThrottled && last.Evidence.RetryAfter > 0 {
			e.RetryAfter = last.Evidence.RetryAfter
		}
		return outcome{Err: e}
	case workflows.StateSpendExhausted:
		// The action's own budget, not a provider: OpenAI's answer for a
		// spent quota, and not to be retried as it is.
		return outcome{Err: &apiError{Status: http.StatusTooManyRequests, Type: typeInsufficientQuota, Code: typeInsufficientQuota,
			Message: "the action's budget is spent (" + res.Reason + "): its next attempt's worst case did not fit, so it was not sent"}}
	case workflows.StateIndeterminate:
		return outcome{Err: &apiError{Status: http.StatusConflict, Type: typeIndeterminate, Code: res.Reason,
			Message: "the action ended indeterminate (" + res.Reason + "): the provider may have run the request and nobody can tell; sending it again may run it twice"}}
	case workflows.StateCanceled:
		return outcome{Err: &apiError{Status: http.StatusConflict, Type: typeCanceled, Code: string(res.Origin),
			Message: "the action was canceled (" + string(res.Origin) + ")"}}
	case workflows.StateAwaitingReconciliation:
		return outcome{Err: awaitingError(res.ActionRef, res.AwaitingAttempt)}
	}
	return outcome{Err: &apiError{Status: http.StatusInternalServerError, Type: typeServer, Message: "the action is in an unknown state " + string(res.State)}}
}

// awaitingError is the answer for an action that waits for a verdict: it
// says how to resolve it. The same key gets the verdict's answer later.
func awaitingError(id string, attempt int) *apiError {
	n := strconv.Itoa(attempt)
	return &apiError{Status: http.StatusConflict, Type: typeAwaiting, Code: codeAwaitingReconcilation,
		Message: "attempt " + n + " of action " + id + " may have run at the provider and its answer was lost, so it is not sent again: " +
			"an operator settles it (POST /v1/actions/" + id + "/reconcile, or 'durallm reconcile " + id + " --attempt " + n + " --verdict completed|not_executed|allow_replay|abandon'); " +
			"the same Idempotency-Key then gets the verdict's answer"}
}

// rejectedError is the provider's own status and error object for a
// request it rejected; 401 and 403 are the route's key, not the caller's,
// so they are a 502; a content filter is a 400 content_filter.
func rejectedError(res workflows.ActionResult) *apiError {
	e := &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: res.Reason,
		Message: "the provider rejected the request (" + res.Reason + ")"}
	if res.Response != nil && res.Response.Error != nil {
		pe := res.Response.Error
		if pe.Message != "" {
			e.Message = pe.Message
		}
		if pe.Type != "" {
			e.Type = pe.Type
		}
		e.Code, e.Param = pe.Code, pe.Param
	}
	if res.Outcome == classContentFiltered {
		e.Status, e.Type, e.Code = http.StatusBadRequest, typeInvalidRequest, codeContentFilter
		return e
	}
	status := 0
	if last, ok := lastAttempt(res); ok {
		status = last.Evidence.Status
	}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return &apiError{Status: http.StatusBadGateway, Type: typeUpstreamAuth, Code: strconv.Itoa(status),
			Message: "the provider refused the gateway's credentials for the route (" + strconv.Itoa(status) + "): the route's key, not yours, needs fixing"}
	case status == http.StatusBadRequest, status == http.StatusNotFound, status == http.StatusRequestEntityTooLarge, status == http.StatusUnprocessableEntity:
		e.Status = status
	}
	return e
}

func lastAttempt(res workflows.ActionResult) (workflows.AttemptRecord, bool) {
	if len(res.Attempts) == 0 {
		return workflows.AttemptRecord{}, false
	}
	return res.Attempts[len(res.Attempts)-1], true
}
