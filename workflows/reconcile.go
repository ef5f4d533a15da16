package workflows

import (
	"fmt"
	"strconv"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
)

// checkVerdict is the reconcile Update's validator: it rejects with a clear
// message and writes nothing. The rejection is an application error whose
// type (RejectNotAwaiting, ...) says why, so a client decides on the type,
// never on the message.
func (w *action) checkVerdict(r ReconcileRequest) error {
	reject := func(typ, format string, args ...any) error {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf(format, args...), typ, nil)
	}
	switch {
	case w.status.State != StateAwaitingReconciliation:
		return reject(RejectNotAwaiting, "action %s is %s, not awaiting reconciliation", w.status.ActionRef, w.status.State)
	case w.verdict != nil:
		return reject(RejectVerdictPending, "a %s verdict for attempt %d is already being applied", w.verdict.Verdict, w.verdict.Attempt)
	case r.Attempt != w.status.AwaitingAttempt:
		return reject(RejectStaleAttempt, "stale attempt %d: action %s awaits reconciliation of attempt %d", r.Attempt, w.status.ActionRef, w.status.AwaitingAttempt)
	}
	return validVerdict(r)
}

// validVerdict checks the verdict itself: a known one, and a completed
// one with its result.
func validVerdict(r ReconcileRequest) error {
	reject := func(format string, args ...any) error {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf(format, args...), RejectInvalidVerdict, nil)
	}
	switch r.Verdict {
	case attempt.VerdictCompleted:
		if r.Response == nil && r.ResultRef == "" {
			return reject("verdict completed needs a response or a result_ref")
		}
	case attempt.VerdictNotExecuted, attempt.VerdictAllowReplay, attempt.VerdictAbandon:
	default:
		return reject("unknown verdict %q: want completed, not_executed, allow_replay or abandon", r.Verdict)
	}
	return nil
}

func (w *action) acceptVerdict(r ReconcileRequest, via string) {
	w.verdict = &r
	by := ""
	if r.By != "" {
		by = " by " + r.By
	}
	w.note(fmt.Sprintf("reconcile %s%s via %s for attempt %d", r.Verdict, by, via, r.Attempt))
}

// countVerdict counts an applied verdict by its source: "journal",
// "provider", "reconciler", "person", or "timeout" when the wait ran out
// and nobody decided. Both are from fixed sets, so they are safe label values.
func (w *action) countVerdict(verdict attempt.Verdict, from string) {
	workflow.GetMetricsHandler(w.ctx).WithTags(map[string]string{"verdict": string(verdict), "by": from}).Counter("durallm.reconciliations").Inc(1)
}

// afterVerdict waits for a verdict on an ambiguous attempt and applies
// it (docs/contract.md section 5): the action ends, or goes on with
// another attempt within the same budget. avoid is what the attempt's
// decision said the next attempt must avoid.
func (w *action) afterVerdict(cur *cursor, rec AttemptRecord, avoid []string) (ActionResult, bool) {
	v, from, end := w.reconcile(rec)
	switch end {
	case scopeEndedWhileWaiting:
		// No verdict: the attempt keeps its worst case.
		w.settleVerdict(rec.N, attempt.VerdictNone, nil)
		return w.endCanceled(), true
	case waitTimedOut:
		w.settleVerdict(rec.N, attempt.VerdictNone, nil)
		w.countVerdict("timeout", from)
		return w.end(StateIndeterminate, string(evidence.Ambiguous), "reconcile_timeout"), true
	}
	// The verdict settles the reservation the attempt held, before the
	// next attempt is sized against the budget.
	w.settleVerdict(rec.N, v.Verdict, v.Response)
	w.countVerdict(v.Verdict, from)
	last := &w.status.Attempts[len(w.status.Attempts)-1] // the attempt reconciled
	last.Verdict, last.VerdictBy = v.Verdict, from
	p := w.position(cur, rec)
	p.avoid = avoid
	pl := decideVerdict(v.Verdict, rec.Classification, p)
	for _, n := range pl.notes {
		w.note(n)
	}
	if pl.end != "" {
		if pl.end == StateReconciled {
			w.response, w.resRef = v.Response, v.ResultRef
		}
		return w.end(pl.end, pl.outcome, pl.reason), true
	}
	w.count("durallm.ambiguous_replays", "reason", "verdict_"+string(v.Verdict))
	w.move(cur, pl)
	return ActionResult{}, false
}

// recoverLostPartial asks the worker's reconciler for the whole response
// of a partial that committed on a worker that was lost: its text is not
// in history, but the journal may hold it. A cancel meanwhile leaves the
// partial standing: what was delivered was delivered.
func (w *action) recoverLostPartial(rec AttemptRecord) (ActionResult, bool) {
	v, ok, _ := w.runReconciler(rec)
	if !ok || v.Verdict != attempt.VerdictCompleted {
		return ActionResult{}, false
	}
	// The whole response has the usage the partial lacked.
	w.settleVerdict(rec.N, v.Verdict, v.Response)
	w.record(Decision{Next: DecideFinish, Why: rec.Classification.Reason + ": the response from " + v.By})
	last := &w.status.Attempts[len(w.status.Attempts)-1]
	last.Verdict, last.VerdictBy = v.Verdict, v.By
	w.countVerdict(v.Verdict, v.By)
	w.response, w.resRef = v.Response, v.ResultRef
	return w.end(StateReconciled, string(attempt.VerdictCompleted), "reconciled"), true
}

// waitEnd says how a wait for a verdict ended.
type waitEnd int

const (
	verdictArrived waitEnd = iota
	waitTimedOut
	scopeEndedWhileWaiting
)

// reconcile waits for a verdict on an ambiguous attempt: the reconciler's,
// or one from a person or program, or the timeout, or the scope ending.
//
// from says who decided: attempt.ByJournal, attempt.ByProvider or
// attempt.ByReconciler for the worker's reconciler, "person" for a
// verdict sent by a signal or Update (whatever its By says, which the
// notes keep).
func (w *action) reconcile(rec AttemptRecord) (v ReconcileRequest, from string, end waitEnd) {
	w.status.AwaitingAttempt, w.status.AwaitingSince = rec.N, workflow.Now(w.ctx)
	w.verdict = nil
	w.setState(StateAwaitingReconciliation, string(evidence.Ambiguous), rec.Route)
	if w.plan.Reconciler {
		v, ok, stopped := w.runReconciler(rec)
		switch {
		case stopped:
			w.status.AwaitingAttempt, w.status.AwaitingSince = 0, time.Time{}
			return ReconcileRequest{}, "", scopeEndedWhileWaiting
		case ok:
			w.status.AwaitingAttempt, w.status.AwaitingSince = 0, time.Time{}
			return v, v.By, verdictArrived
		}
	}
	// Counted, with what the journal knew, so that an operator sees how
	// much is left to people and why (docs/operations.md).
	js := w.attemptRecord(rec.N).JournalState
	if js == "" {
		js = "off"
	}
	w.count("durallm.left_to_person", "journal_state", js)
	w.details()
	got, err := workflow.AwaitWithTimeout(w.ctx, w.in.ReconcileTimeout, func() bool { return w.verdict != nil || w.cancelReq != nil })
	w.status.AwaitingAttempt, w.status.AwaitingSince = 0, time.Time{}
	switch {
	case w.verdict != nil:
		v := *w.verdict
		w.verdict = nil
		return v, "person", verdictArrived
	case err != nil || w.cancelReq != nil:
		w.scopeEnded()
		return ReconcileRequest{}, "", scopeEndedWhileWaiting
	case !got:
		w.note("reconciliation timed out after " + w.in.ReconcileTimeout.String())
	}
	return ReconcileRequest{}, "timeout", waitTimedOut
}

// runReconciler runs the worker's reconciler (the journal first, then the
// application's) on an ambiguous attempt. ok says it gave a valid
// verdict; stopped, that the scope ended while it ran: the reconcile
// activity only reads, so it is canceled and not waited for, and the
// action's cancel takes effect at once rather than when the reconciler
// would have returned (it may wait up to the attempt's deadline).
func (w *action) runReconciler(rec AttemptRecord) (v ReconcileRequest, ok, stopped bool) {
	// The built-in reconciler may wait for an attempt that can still end
	// on a live worker, until the attempt's deadline, and look for the
	// route's provider record for its settle window after that: the
	// activity's own timeout leaves room for both.
	remaining := max(0, rec.Deadline.Sub(workflow.Now(w.ctx)))
	var settle time.Duration
	for _, r := range w.plan.Routes {
		if r.Name == rec.Route {
			settle = r.ProviderRecordSettle
		}
	}
	ctx, cancel := workflow.WithCancel(workflow.WithActivityOptions(w.actx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute + remaining + settle,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
		Summary:             "reconcile attempt " + strconv.Itoa(rec.N),
	}))
	defer cancel()
	fut := workflow.ExecuteActivity(ctx, attempt.Reconcile, attempt.ReconcileInput{
		ActionRef: w.status.ActionRef, IdempotencyKey: w.in.IdempotencyKey, Attempt: rec.N,
		AttemptID: rec.Evidence.AttemptID, Route: rec.Route, Evidence: rec.Evidence, Remaining: remaining,
	})
	_ = workflow.Await(w.ctx, func() bool { return fut.IsReady() || w.cancelReq != nil })
	if !fut.IsReady() && w.scopeEnded() {
		// Not waiting for cancellation, the future settles at once.
		cancel()
		_ = fut.Get(ctx, nil)
		w.note("the reconciler was canceled: the action's scope ended (" + string(w.origin) + ")")
		return ReconcileRequest{}, false, true
	}
	var out attempt.ReconcileOutput
	err := fut.Get(ctx, &out)
	if out.JournalState != "" {
		w.attemptRecord(rec.N).JournalState = out.JournalState
	}
	if out.ProviderRecord != "" {
		w.attemptRecord(rec.N).ProviderRecord = out.ProviderRecord
	}
	if err != nil {
		w.note("reconciler failed: " + err.Error())
		return ReconcileRequest{}, false, false
	}
	by := out.By
	if by == "" {
		by = attempt.ByReconciler
	}
	r := ReconcileRequest{Attempt: rec.N, Verdict: out.Verdict, Response: out.Response, ResultRef: out.ResultRef, By: by}
	if out.Verdict == attempt.VerdictNone {
		w.note("reconciler (" + by + ") could not tell: " + out.Note)
		return ReconcileRequest{}, false, false
	}
	if err := validVerdict(r); err != nil {
		w.note("reconciler verdict ignored: " + err.Error())
		return ReconcileRequest{}, false, false
	}
	w.note("reconciler verdict " + string(out.Verdict) + " by " + by)
	return r, true, false
}
