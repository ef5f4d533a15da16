package gateway

import (
	"strconv"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/workflows"
)

// outcome is how an ended action answers its caller (docs/contract.md
// section 6.5): its answer (marked incomplete for a partial one), or a
// problem that keeps the states apart. This is the one place that
// decides it; every surface renders what it says.
type outcome struct {
	// OK: the answer is the response (completed, completed_partial,
	// reconciled).
	OK bool
	// Incomplete is why a completed_partial answer was cut.
	Incomplete string
	// Problem is the answer otherwise.
	Problem *answer.Problem
}

// The classes an ended action's outcome may name that decide the answer.
// They are the contract's words (docs/contract.md section 3.1), compared as
// the strings ActionResult.Outcome carries.
const (
	classContentFiltered = "content_filtered"
	classThrottled       = "throttled"
)

// outcomeOf maps a terminal result (or one awaiting reconciliation) to
// its answer.
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
		return outcome{Problem: rejectedProblem(res)}
	case workflows.StateFailed:
		p := &answer.Problem{Kind: answer.Failed, Code: res.Reason,
			Message: "no provider could answer: the action failed (" + res.Reason + "); retrying it now starts a new action"}
		if last, ok := lastAttempt(res); ok && res.Outcome == classThrottled && last.Evidence.RetryAfter > 0 {
			p.RetryAfter = last.Evidence.RetryAfter
		}
		return outcome{Problem: p}
	case workflows.StateSpendExhausted:
		// The action's own budget, not a provider's failure.
		return outcome{Problem: &answer.Problem{Kind: answer.SpendExhausted,
			Message: "the action's budget is spent (" + res.Reason + "): its next attempt's worst case did not fit, so it was not sent"}}
	case workflows.StateIndeterminate:
		return outcome{Problem: &answer.Problem{Kind: answer.Indeterminate, Code: res.Reason,
			Message: "the action ended indeterminate (" + res.Reason + "): the provider may have run the request and nobody can tell; sending it again may run it twice"}}
	case workflows.StateCanceled:
		return outcome{Problem: &answer.Problem{Kind: answer.Canceled, Code: string(res.Origin),
			Message: "the action was canceled (" + string(res.Origin) + ")"}}
	case workflows.StateAwaitingReconciliation:
		return outcome{Problem: awaitingProblem(res.ActionRef, res.AwaitingAttempt)}
	}
	return outcome{Problem: &answer.Problem{Kind: answer.Internal, Message: "the action is in an unknown state " + string(res.State)}}
}

// awaitingProblem is the answer for an action that waits for a verdict:
// it says how to resolve it. The same key gets the verdict's answer later.
func awaitingProblem(id string, attempt int) *answer.Problem {
	n := strconv.Itoa(attempt)
	return &answer.Problem{Kind: answer.AwaitingVerdict,
		Message: "attempt " + n + " of action " + id + " may have run at the provider and its answer was lost, so it is not sent again: " +
			"an operator settles it (POST /v1/actions/" + id + "/reconcile, or 'durallm reconcile " + id + " --attempt " + n + " --verdict completed|not_executed|allow_replay|abandon'); " +
			"the same Idempotency-Key then gets the verdict's answer"}
}

// rejectedProblem is the provider's rejection with its status and error
// object; 401 and 403 are the route's key, not the caller's; a content
// filter is its own kind.
func rejectedProblem(res workflows.ActionResult) *answer.Problem {
	p := &answer.Problem{Kind: answer.Rejected, Code: res.Reason,
		Message: "the provider rejected the request (" + res.Reason + ")"}
	if res.Response != nil {
		p.ProviderError = res.Response.Error
	}
	if res.Outcome == classContentFiltered {
		p.Kind = answer.ContentFiltered
		return p
	}
	if last, ok := lastAttempt(res); ok {
		p.ProviderStatus = last.Evidence.Status
	}
	if s := p.ProviderStatus; s == 401 || s == 403 {
		return &answer.Problem{Kind: answer.UpstreamAuth, Code: strconv.Itoa(s),
			Message: "the provider refused the gateway's credentials for the route (" + strconv.Itoa(s) + "): the route's key, not yours, needs fixing"}
	}
	return p
}

func lastAttempt(res workflows.ActionResult) (workflows.AttemptRecord, bool) {
	if len(res.Attempts) == 0 {
		return workflows.AttemptRecord{}, false
	}
	return res.Attempts[len(res.Attempts)-1], true
}
