package workflows

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
)

// attemptTimeout is the one rule for an attempt's timeout: the action's
// attempt_timeout when set, else the route's (which defaults to 60s),
// never past what is left of the deadline. The activity applies it to the
// exchange itself.
func (w *action) attemptTimeout(route attempt.RouteInfo, remaining time.Duration) time.Duration {
	timeout := w.in.AttemptTimeout
	if timeout <= 0 {
		timeout = route.AttemptTimeout
	}
	if timeout <= 0 {
		timeout = attempt.DefaultAttemptTimeout
	}
	return min(timeout, remaining)
}

// attempt dispatches one CallModel and waits for it, or for the scope to
// end, whichever comes first; then it waits for the activity to settle so
// its evidence is final.
func (w *action) attempt(route attempt.RouteInfo, nx nextAttempt) AttemptRecord {
	if w.origin != "" {
		// Never expected: scopeEnded is checked right before every
		// attempt. The counter backs the "zero in a healthy system" alert.
		w.count("durallm.attempts_after_cancel", "origin", string(w.origin))
	}
	w.status.Used++
	n := w.status.Used
	remaining := w.deadline.Sub(workflow.Now(w.ctx))
	timeout := w.attemptTimeout(route, remaining)
	input := attempt.Input{
		ActionRef: w.status.ActionRef, Attempt: n,
		AttemptID:      w.attemptID(n),
		IdempotencyKey: w.in.IdempotencyKey, Route: route.Name, Request: w.in.Request,
		Avoid: nx.avoid, FreshConnection: nx.fresh, AfterMisdirected: w.misdirected,
		Timeout: timeout, Caller: w.in.Caller,
	}
	queue := min(w.in.QueueTimeout, remaining)
	now := workflow.Now(w.ctx)
	rec := AttemptRecord{N: n, Route: route.Name, Why: nx.why, Scheduled: now, Deadline: now.Add(queue + timeout + attemptGrace)}
	// The worst case is reserved before the attempt is sent: the budget
	// can never be overshot by what it could not see.
	input.Request = w.reserve(&rec, nx.grant)
	rec.Summary = summary(n, nx, route)
	actx, cancel := workflow.WithCancel(workflow.WithActivityOptions(w.actx, workflow.ActivityOptions{
		ScheduleToStartTimeout: queue,
		StartToCloseTimeout:    timeout + attemptGrace,
		HeartbeatTimeout:       heartbeatTimeout,
		WaitForCancellation:    true,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
		Summary:                rec.Summary,
	}))
	w.status.Attempts = append(w.status.Attempts, rec)
	w.setState(StateDispatching, "", route.Name)

	fut := workflow.ExecuteActivity(actx, attempt.CallModel, input)
	settledOrStopped := func() bool { return fut.IsReady() || w.cancelReq != nil }
	if w.deadlineTimerNeeded(rec) {
		_, _ = workflow.AwaitWithTimeout(w.ctx, remaining, settledOrStopped)
	} else {
		_ = workflow.Await(w.ctx, settledOrStopped)
	}
	if !fut.IsReady() {
		// The scope ended mid-attempt: cancel the activity through its
		// heartbeat and wait for it to settle, so its evidence is final.
		w.scopeEnded()
		if w.origin == "" {
			w.origin = OriginOverallDeadline
		}
		cancel()
	}
	var out attempt.Outcome
	if err := fut.Get(w.actx, &out); err != nil {
		out = outcomeOfError(err, input)
		if out.Evidence.Activity == evidence.ActivityFailed {
			// Our activity's errors never carry content; the message is
			// what an operator needs to find the cause.
			w.note(fmt.Sprintf("attempt %d: the activity failed without an outcome: %v", n, err))
		}
	}
	cancel()
	rec.Evidence, rec.Classification = out.Evidence, out.Classification
	rec.HealthMoved = out.Classification.ProviderHealth
	rec.Duration = workflow.Now(w.ctx).Sub(rec.Scheduled)
	w.status.Attempts[len(w.status.Attempts)-1] = rec
	usage := out.Usage
	if usage == nil && out.Response != nil {
		// An outcome from before Outcome.Usage carries it in its response.
		usage = &out.Response.Usage
	}
	w.recordUsage(n, usage)
	rec = w.status.Attempts[len(w.status.Attempts)-1]
	if replays := out.Evidence.TransportReplays; replays > 0 {
		// A lower layer sent the request again: each stream counts
		// against the one budget.
		w.status.Used += replays
		w.note(fmt.Sprintf("attempt %d: %d transport replay(s) charged to the budget", n, replays))
	}
	switch {
	case out.Response != nil:
		w.response, w.resRef = out.Response, ""
	case out.ResponseRef != "":
		// Too large for history: the client resolves the reference.
		w.response, w.resRef = nil, out.ResponseRef
	}
	w.log.Info("attempt finished", "attempt", n, "route", route.Name, "classification", string(rec.Classification.Class), "reason", rec.Classification.Reason)
	return rec
}

// attemptID is attempt n's id, <run id>-<n>: its X-Durallm-Attempt
// header, and the id its budget reservation is held under.
func (w *action) attemptID(n int) string {
	return w.info.WorkflowExecution.RunID + "-" + strconv.Itoa(n)
}

// deadlineTimerMargin is how long before the deadline the attempt's own
// Temporal timeouts must end it for the deadline timer to be left out: the
// server fires those timeouts from its timer queue, a little late under
// load, and only a timer that could never fire first may go.
const deadlineTimerMargin = 30 * time.Second

// deadlineTimerNeeded says whether the overall deadline must be timed
// around this attempt. Temporal ends the activity by rec.Deadline at the
// latest (ScheduleToStart after the queue timeout, then StartToClose
// after the attempt timeout and its grace); when that is well before the
// deadline, a timer for the deadline could never fire first.
func (w *action) deadlineTimerNeeded(rec AttemptRecord) bool {
	return w.plan.DeadlineTimer < attempt.DeadlineTimerNearDeadline || rec.Deadline.Add(deadlineTimerMargin).After(w.deadline)
}

// outcomeOfError turns an activity that did not return an outcome into
// one. It decides no class: it writes what the workflow saw into the
// evidence (the cancellation's details are the activity's own outcome;
// a timeout's last heartbeat is evidence, never proof) and Classify
// decides.
func outcomeOfError(err error, in attempt.Input) attempt.Outcome {
	var canceled *temporal.CanceledError
	var timeout *temporal.TimeoutError
	if errors.As(err, &canceled) && canceled.HasDetails() {
		var out attempt.Outcome
		if canceled.Details(&out) == nil && out.Evidence.AttemptID == in.AttemptID {
			return out
		}
	}
	ev := evidence.Evidence{ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID, Route: in.Route, AfterMisdirected: in.AfterMisdirected}
	switch {
	case errors.As(err, &canceled):
		// Canceled before a worker ran it, or by a worker that sent no
		// outcome: the workflow asked, so it is the scope.
		ev.Canceled, ev.Stop = true, evidence.StopScope
	case errors.As(err, &timeout):
		if timeout.HasLastHeartbeatDetails() {
			var p attempt.Progress
			if timeout.LastHeartbeatDetails(&p) == nil {
				ev.ConnRef, ev.ContentStarted, ev.ResponseBytes = p.ConnRef, p.ContentStarted, p.ResponseBytes
			}
		}
		switch timeout.TimeoutType() {
		case enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START:
			ev.Activity = evidence.ActivityQueueTimeout
		case enumspb.TIMEOUT_TYPE_HEARTBEAT:
			ev.Activity = evidence.ActivityWorkerLost
		default:
			ev.Activity = evidence.ActivityTimedOut
		}
	default:
		ev.Activity = evidence.ActivityFailed
	}
	return attempt.Outcome{Evidence: ev, Classification: evidence.Classify(ev)}
}

// mayReplay applies the replay policy to an ambiguous attempt: only a route
// that honours Idempotency-Key, within its window, and never an attempt
// known to have committed (subscribers would get a second answer).
func (w *action) mayReplay(route attempt.RouteInfo, rec AttemptRecord) bool {
	if rec.Evidence.ContentStarted || w.in.ReplayPolicy != ReplayIdempotent || !route.HonoursIdempotencyKey || route.IdempotencyWindow <= 0 {
		return false
	}
	return workflow.Now(w.ctx).Sub(rec.Scheduled) < route.IdempotencyWindow
}
