// Package workflows holds LLMAction, the workflow that owns one user
// action: its attempt budget, overall deadline, cancellation scope, route
// choice, reconciliation wait and terminal state (CONTRACT.md sections 1, 4
// and 5). It decides; the CallModel activity acts; the recovery engine
// observes.
//
// Everything here is deterministic workflow code: time comes from
// workflow.Now, randomness from a hash of the run id, and all waiting goes
// through Temporal timers and Await.
package workflows

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
)

// Search attributes the workflow keeps current. They are keywords so
// "all actions awaiting reconciliation" is one query:
//
//	DurallmState = "awaiting_reconciliation"
var (
	AttrState   = temporal.NewSearchAttributeKeyKeyword("DurallmState")
	AttrOutcome = temporal.NewSearchAttributeKeyKeyword("DurallmOutcome")
	AttrRoute   = temporal.NewSearchAttributeKeyKeyword("DurallmRoute")
)

// SearchAttributes lists the search attributes to register in a namespace
// (all Keyword), for servers the project sets up itself.
var SearchAttributes = map[string]enumspb.IndexedValueType{
	"DurallmState":   enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	"DurallmOutcome": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	"DurallmRoute":   enumspb.INDEXED_VALUE_TYPE_KEYWORD,
}

// ErrInvalidInput is the type of the non-retryable application error an
// action fails with when its input is invalid.
const ErrInvalidInput = "InvalidInput"

const (
	defaultMaxAttempts      = 4
	maxMaxAttempts          = 50
	defaultDeadline         = 5 * time.Minute
	defaultAttemptTimeout   = 60 * time.Second
	defaultQueueTimeout     = 30 * time.Second
	defaultReconcileTimeout = 24 * time.Hour
	defaultRetriesPerRoute  = 1
	// heartbeatTimeout detects a dead worker. The activity heartbeats every
	// 250ms; the worker's heartbeat throttle decides how fast a cancel is
	// delivered.
	heartbeatTimeout = 5 * time.Second
	// attemptGrace lets the activity's own timer end the HTTP exchange
	// (with full evidence) before Temporal's StartToClose does.
	attemptGrace = 2 * time.Second
)

// LLMAction runs one user action to exactly one terminal state. Its result
// is an ActionResult for every terminal state; it fails (non-retryable,
// type InvalidInput) only when the input is invalid, before anything is
// dispatched.
func LLMAction(ctx workflow.Context, in ActionInput) (ActionResult, error) {
	w, err := newAction(ctx, in)
	if err != nil {
		return ActionResult{}, err
	}
	return w.run(), nil
}

// action is one run's state. Fields are touched only by the workflow's
// coroutines, which Temporal runs one at a time.
type action struct {
	ctx  workflow.Context // the workflow's own; canceled by Temporal cancellation
	actx workflow.Context // disconnected: activities and cleanup outlive a cancel request
	in   ActionInput
	info *workflow.Info
	log  log.Logger

	status   Status
	plan     activities.Plan
	routes   []activities.RouteInfo
	deadline time.Time
	response *providers.Response
	resRef   string

	cancelReq *CancelRequest
	origin    CancelOrigin // set once the scope has ended
	verdict   *ReconcileRequest

	cancelCh, reconcileCh workflow.ReceiveChannel
}

func newAction(ctx workflow.Context, in ActionInput) (*action, error) {
	in = in.WithDefaults(workflow.GetInfo(ctx).WorkflowExecution.ID)
	if err := in.Validate(); err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), ErrInvalidInput, err)
	}
	actx, _ := workflow.NewDisconnectedContext(ctx)
	info := workflow.GetInfo(ctx)
	w := &action{
		ctx: ctx, actx: actx, in: in, info: info, log: workflow.GetLogger(ctx),
		deadline: workflow.Now(ctx).Add(in.Deadline),
		status: Status{
			ActionRef: info.WorkflowExecution.ID, State: StateQueued,
			Budget: in.MaxAttempts, Attempts: []AttemptRecord{},
		},
		cancelCh:    workflow.GetSignalChannel(ctx, SignalCancel),
		reconcileCh: workflow.GetSignalChannel(ctx, SignalReconcile),
	}
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (Status, error) { return w.status, nil }); err != nil {
		return nil, err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateReconcile,
		func(_ workflow.Context, r ReconcileRequest) (string, error) {
			w.acceptVerdict(r, "update")
			return "accepted: " + string(r.Verdict) + " for attempt " + strconv.Itoa(r.Attempt), nil
		},
		workflow.UpdateHandlerOptions{Validator: func(r ReconcileRequest) error { return w.checkVerdict(r) }},
	); err != nil {
		return nil, err
	}
	workflow.Go(ctx, w.receiveSignals)
	return w, nil
}

// receiveSignals handles cancel and reconcile signals as they arrive.
func (w *action) receiveSignals(ctx workflow.Context) {
	for {
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(w.cancelCh, func(c workflow.ReceiveChannel, _ bool) {
			var r CancelRequest
			c.Receive(ctx, &r)
			w.onCancel(r)
		})
		sel.AddReceive(w.reconcileCh, func(c workflow.ReceiveChannel, _ bool) {
			var r ReconcileRequest
			c.Receive(ctx, &r)
			if err := w.checkVerdict(r); err != nil {
				w.note("reconcile signal ignored: " + err.Error())
				return
			}
			w.acceptVerdict(r, "signal")
		})
		sel.Select(ctx)
	}
}

func (w *action) onCancel(r CancelRequest) {
	switch {
	case w.status.State.Terminal():
		w.note("cancel (" + string(r.Origin) + ") after the terminal state: ignored")
		return
	case w.cancelReq != nil:
		w.note("cancel (" + string(r.Origin) + ") repeated: ignored")
		return
	}
	if !r.Origin.Requestable() {
		// A stop request with a wrong origin is still a stop request:
		// ignoring it would keep spending.
		w.note("cancel with unknown origin " + strconv.Quote(string(r.Origin)) + " taken as user_stop")
		r.Origin = OriginUserStop
	}
	w.cancelReq = &r
	w.note("cancel requested: " + string(r.Origin))
}

// checkVerdict is the reconcile Update's validator: it rejects with a clear
// message and writes nothing.
func (w *action) checkVerdict(r ReconcileRequest) error {
	switch {
	case w.status.State != StateAwaitingReconciliation:
		return fmt.Errorf("action %s is %s, not awaiting reconciliation", w.status.ActionRef, w.status.State)
	case w.verdict != nil:
		return fmt.Errorf("a %s verdict for attempt %d is already being applied", w.verdict.Verdict, w.verdict.Attempt)
	case r.Attempt != w.status.AwaitingAttempt:
		return fmt.Errorf("stale attempt %d: action %s awaits reconciliation of attempt %d", r.Attempt, w.status.ActionRef, w.status.AwaitingAttempt)
	}
	switch r.Verdict {
	case activities.VerdictCompleted:
		if r.Response == nil && r.ResultRef == "" {
			return errors.New("verdict completed needs a response or a result_ref")
		}
	case activities.VerdictNotExecuted, activities.VerdictAllowReplay, activities.VerdictAbandon:
	default:
		return fmt.Errorf("unknown verdict %q: want completed, not_executed, allow_replay or abandon", r.Verdict)
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

func (w *action) note(what string) {
	w.status.Notes = append(w.status.Notes, Note{At: workflow.Now(w.ctx), What: what})
}

// run is the state machine. It returns exactly once, with the terminal
// result.
func (w *action) run() ActionResult {
	if !w.loadPlan() {
		return w.end(StateFailed, "no_route", "no route satisfies the action's needs")
	}
	w.setState(StateQueued, "", "")
	var (
		ri           = 0 // current route
		triesOnRoute = 0
		next         = nextAttempt{why: "primary"}
		retries      = 0 // waits so far, for the backoff window
		last         recovery.Classification
	)
	for {
		if w.scopeEnded() {
			return w.endCanceled()
		}
		if w.status.Used >= w.in.MaxAttempts {
			return w.end(StateFailed, string(last.Class), "budget_exhausted")
		}
		route := w.routes[ri]
		rec := w.attempt(route, next)
		if rec.Classification.Class == recovery.Canceled && w.origin == "" {
			// The attempt's context ended without the action asking (the
			// worker is stopping): the request may have left, so it is
			// ambiguous, never a silent retry.
			rec.Classification = recovery.Classification{Class: recovery.Ambiguous, Reason: "attempt_abandoned_by_worker", NeedsReconciliation: true}
			w.status.Attempts[len(w.status.Attempts)-1] = rec
		}
		c := rec.Classification
		last = c
		if w.origin != "" && c.Class != recovery.Completed && c.Class != recovery.CommittedPartial {
			return w.endCanceled()
		}
		avoid := next.avoid
		if rec.Evidence.ConnRef != "" && (c.FreshConnection || rec.Evidence.GoAway != nil) {
			avoid = appendUnique(avoid, rec.Evidence.ConnRef)
		}

		switch c.Class {
		case recovery.Completed:
			return w.endWith(StateCompleted, c)
		case recovery.CommittedPartial:
			return w.endWith(StateCompletedPartial, c)
		case recovery.Canceled:
			return w.endCanceled()
		case recovery.Rejected, recovery.ContentFiltered:
			return w.end(StateRejected, string(c.Class), c.Reason)
		case recovery.MisdirectedRepeated:
			return w.end(StateFailed, string(c.Class), c.Reason)

		case recovery.Misdirected:
			next = nextAttempt{why: "421 retry", detail: "fresh connection after 421", avoid: avoid, fresh: true, afterMisdirected: true}
			continue
		case recovery.Refused:
			if c.RouteMisconfigured {
				if ri+1 < len(w.routes) {
					ri, triesOnRoute = ri+1, 0
					next = nextAttempt{why: "fallback", detail: "after " + c.Reason + " on " + route.Name}
					continue
				}
				return w.end(StateFailed, string(c.Class), c.Reason)
			}
			next = nextAttempt{why: "transport retry", detail: freshDetail(rec.Evidence), avoid: avoid}
			continue

		case recovery.Ambiguous:
			if w.mayReplay(route, rec) {
				w.count("durallm.ambiguous_replays", "reason", "idempotency_policy")
				next = nextAttempt{why: "replay", detail: "route honours Idempotency-Key", avoid: avoid}
				continue
			}
			v, ok := w.reconcile(rec)
			if !ok {
				return w.endCanceled()
			}
			w.count("durallm.reconciliations", "verdict", reconcileLabel(v))
			switch v.Verdict {
			case activities.VerdictCompleted:
				w.response, w.resRef = v.Response, v.ResultRef
				return w.end(StateReconciled, string(activities.VerdictCompleted), "reconciled")
			case activities.VerdictNotExecuted, activities.VerdictAllowReplay:
				w.count("durallm.ambiguous_replays", "reason", "verdict_"+string(v.Verdict))
				next = nextAttempt{why: "retry after verdict " + string(v.Verdict), avoid: avoid}
				continue
			default:
				return w.end(StateIndeterminate, string(recovery.Ambiguous), reconcileEnd(v))
			}

		case recovery.EmptyResponse, recovery.IncompatibleRoute:
			if ri+1 < len(w.routes) {
				ri, triesOnRoute = ri+1, 0
				next = nextAttempt{why: "fallback", detail: "after " + string(c.Class) + " on " + route.Name}
				continue
			}
			return w.end(StateFailed, string(c.Class), c.Reason)

		default: // unsent, throttled, upstream_error
			if w.status.Used >= w.in.MaxAttempts {
				// No attempt is left to wait for.
				return w.end(StateFailed, string(c.Class), "budget_exhausted")
			}
			fallback := ri+1 < len(w.routes) && c.Fallback
			same := c.SameRoute && (triesOnRoute < w.in.RetriesPerRoute || !fallback)
			retries++
			wait, ok := w.in.Backoff.Delay(retries, w.jitter(), c.RetryAfter, w.deadline.Sub(workflow.Now(w.ctx)))
			switch {
			case same && ok:
				triesOnRoute++
				next = nextAttempt{why: "retry", detail: "after " + string(c.Class), avoid: avoid, wait: wait}
			case fallback:
				// A different provider need not wait out this one's pushback.
				ri, triesOnRoute = ri+1, 0
				next = nextAttempt{why: "fallback", detail: "after " + string(c.Class) + " on " + route.Name}
			case same:
				return w.end(StateFailed, string(c.Class), "retry_after_beyond_deadline")
			default:
				return w.end(StateFailed, string(c.Class), c.Reason)
			}
			if next.wait > 0 {
				w.status.Attempts[len(w.status.Attempts)-1].BackoffAfter = next.wait
				if !w.backoff(next.wait) {
					return w.endCanceled()
				}
			}
		}
	}
}

// nextAttempt says how the next attempt is made and why.
type nextAttempt struct {
	why, detail      string
	avoid            []string
	fresh            bool
	afterMisdirected bool
	wait             time.Duration
}

// loadPlan asks the worker for the routes' capabilities and keeps those
// that satisfy the action's needs, in order, noting why others were
// skipped.
func (w *action) loadPlan() bool {
	lctx := workflow.WithLocalActivityOptions(w.actx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	var a *activities.Activities
	if err := workflow.ExecuteLocalActivity(lctx, a.DescribeRoutes, activities.PlanInput{Routes: w.in.Routes}).Get(lctx, &w.plan); err != nil {
		w.note("describe routes failed: " + err.Error())
		return false
	}
	for _, name := range w.plan.Unknown {
		w.note("route " + name + " skipped: not configured on the worker")
	}
	for _, r := range w.plan.Routes {
		if ok, missing := r.Capabilities.Satisfies(w.in.Needs); !ok {
			w.note("route " + r.Name + " skipped: lacks " + strings.Join(missing, ", "))
			continue
		}
		w.routes = append(w.routes, r)
	}
	if len(w.routes) > 0 {
		w.note("routes chosen: " + routeNames(w.routes))
	}
	return len(w.routes) > 0
}

// scopeEnded rechecks the cancellation scope: a cancel signal, Temporal
// cancellation, or the overall deadline. It is called after every wait and
// immediately before every attempt.
func (w *action) scopeEnded() bool {
	switch {
	case w.origin != "":
	case w.cancelReq != nil:
		w.origin = w.cancelReq.Origin
	case w.ctx.Err() != nil:
		w.origin = OriginParentCanceled
	case !workflow.Now(w.ctx).Before(w.deadline):
		w.origin = OriginOverallDeadline
	}
	return w.origin != ""
}

// attempt dispatches one CallModel and waits for it, or for the scope to
// end, whichever comes first; then it waits for the activity to settle so
// its evidence is final.
func (w *action) attempt(route activities.RouteInfo, nx nextAttempt) AttemptRecord {
	if w.origin != "" {
		// Never expected: scopeEnded is checked right before every
		// attempt. The counter backs the "zero in a healthy system" alert.
		w.count("durallm.attempts_after_cancel", "origin", string(w.origin))
	}
	w.status.Used++
	n := w.status.Used
	remaining := w.deadline.Sub(workflow.Now(w.ctx))
	timeout := w.in.AttemptTimeout
	if timeout <= 0 {
		timeout = route.AttemptTimeout
	}
	if timeout <= 0 {
		timeout = defaultAttemptTimeout
	}
	timeout = min(timeout, remaining)
	input := activities.AttemptInput{
		ActionRef: w.status.ActionRef, Attempt: n,
		AttemptID:      w.info.WorkflowExecution.RunID + "-" + strconv.Itoa(n),
		IdempotencyKey: w.in.IdempotencyKey, Route: route.Name, Request: w.in.Request,
		Avoid: nx.avoid, FreshConnection: nx.fresh, AfterMisdirected: nx.afterMisdirected,
		Timeout: timeout,
	}
	rec := AttemptRecord{N: n, Route: route.Name, Why: nx.why, Scheduled: workflow.Now(w.ctx)}
	rec.Summary = summary(n, nx, route)
	actx, cancel := workflow.WithCancel(workflow.WithActivityOptions(w.actx, workflow.ActivityOptions{
		ScheduleToStartTimeout: min(w.in.QueueTimeout, remaining),
		StartToCloseTimeout:    timeout + attemptGrace,
		HeartbeatTimeout:       heartbeatTimeout,
		WaitForCancellation:    true,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
		Summary:                rec.Summary,
	}))
	w.status.Attempts = append(w.status.Attempts, rec)
	w.setState(StateDispatching, "", route.Name)

	var a *activities.Activities
	fut := workflow.ExecuteActivity(actx, a.CallModel, input)
	_, _ = workflow.AwaitWithTimeout(w.ctx, remaining, func() bool { return fut.IsReady() || w.cancelReq != nil })
	if !fut.IsReady() {
		// The scope ended mid-attempt: cancel the activity through its
		// heartbeat and wait for it to settle, so its evidence is final.
		w.scopeEnded()
		if w.origin == "" {
			w.origin = OriginOverallDeadline
		}
		cancel()
	}
	var out activities.Outcome
	if err := fut.Get(w.actx, &out); err != nil {
		out = outcomeOfError(err, input)
	}
	cancel()
	rec.Evidence, rec.Classification = out.Evidence, out.Classification
	rec.HealthMoved = out.Classification.ProviderHealth
	rec.Duration = workflow.Now(w.ctx).Sub(rec.Scheduled)
	w.status.Attempts[len(w.status.Attempts)-1] = rec
	if out.Response != nil {
		w.response, w.resRef = out.Response, ""
	}
	if out.ResponseRef != "" {
		// Too large for history: the client resolves the reference.
		w.response, w.resRef = nil, out.ResponseRef
	}
	w.log.Info("attempt finished", "attempt", n, "route", route.Name, "classification", string(rec.Classification.Class), "reason", rec.Classification.Reason)
	return rec
}

// outcomeOfError turns an activity that did not return an outcome into
// one: a cancellation is canceled; no worker ever taking it is unsent; a
// timeout after it started, or a worker that died, is ambiguous, with the
// last heartbeat as evidence (never as proof).
func outcomeOfError(err error, in activities.AttemptInput) activities.Outcome {
	ev := recovery.Evidence{ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID, Route: in.Route}
	var canceled *temporal.CanceledError
	var timeout *temporal.TimeoutError
	switch {
	case errors.As(err, &canceled):
		ev.Canceled = true
		return activities.Outcome{Evidence: ev, Classification: recovery.Classify(ev)}
	case errors.As(err, &timeout):
		if timeout.HasLastHeartbeatDetails() {
			var p activities.Progress
			if timeout.LastHeartbeatDetails(&p) == nil {
				ev.ConnRef, ev.ContentStarted, ev.ResponseBytes = p.ConnRef, p.ContentStarted, p.ResponseBytes
			}
		}
		switch timeout.TimeoutType() {
		case enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START:
			return activities.Outcome{Evidence: ev, Classification: recovery.Classification{
				Class: recovery.Unsent, Reason: "no_worker_took_the_attempt", ReplaySafe: true, SameRoute: true, Fallback: true,
			}}
		case enumspb.TIMEOUT_TYPE_HEARTBEAT:
			return ambiguousOutcome(ev, "worker_lost_mid_attempt")
		default:
			return ambiguousOutcome(ev, "attempt_timeout")
		}
	default:
		return ambiguousOutcome(ev, "activity_failed")
	}
}

func ambiguousOutcome(ev recovery.Evidence, reason string) activities.Outcome {
	ev.TimedOut = true
	return activities.Outcome{Evidence: ev, Classification: recovery.Classification{
		Class: recovery.Ambiguous, Reason: reason, NeedsReconciliation: true,
	}}
}

// mayReplay applies the replay policy to an ambiguous attempt: only a route
// that honours Idempotency-Key, within its window.
func (w *action) mayReplay(route activities.RouteInfo, rec AttemptRecord) bool {
	if w.in.ReplayPolicy != ReplayIdempotent || !route.HonoursIdempotencyKey || route.IdempotencyWindow <= 0 {
		return false
	}
	return workflow.Now(w.ctx).Sub(rec.Scheduled) < route.IdempotencyWindow
}

// reconcile waits for a verdict on an ambiguous attempt. ok is false when
// the scope ended while waiting.
func (w *action) reconcile(rec AttemptRecord) (ReconcileRequest, bool) {
	w.status.AwaitingAttempt = rec.N
	w.verdict = nil
	w.setState(StateAwaitingReconciliation, string(recovery.Ambiguous), rec.Route)
	if w.plan.Reconciler {
		if v, ok := w.runReconciler(rec); ok {
			w.status.AwaitingAttempt = 0
			return v, true
		}
	}
	got, err := workflow.AwaitWithTimeout(w.ctx, w.in.ReconcileTimeout, func() bool { return w.verdict != nil || w.cancelReq != nil })
	w.status.AwaitingAttempt = 0
	switch {
	case w.verdict != nil:
		v := *w.verdict
		w.verdict = nil
		return v, true
	case err != nil || w.cancelReq != nil:
		w.scopeEnded()
		return ReconcileRequest{}, false
	case !got:
		w.note("reconciliation timed out after " + w.in.ReconcileTimeout.String())
	}
	return ReconcileRequest{Attempt: rec.N, Verdict: activities.VerdictAbandon, By: "timeout"}, true
}

func (w *action) runReconciler(rec AttemptRecord) (ReconcileRequest, bool) {
	ctx := workflow.WithActivityOptions(w.actx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
		Summary:             "reconcile attempt " + strconv.Itoa(rec.N),
	})
	var a *activities.Activities
	var out activities.ReconcileOutput
	err := workflow.ExecuteActivity(ctx, a.Reconcile, activities.ReconcileInput{
		ActionRef: w.status.ActionRef, IdempotencyKey: w.in.IdempotencyKey, Attempt: rec.N,
		AttemptID: rec.Evidence.AttemptID, Route: rec.Route, Evidence: rec.Evidence,
	}).Get(ctx, &out)
	if err != nil {
		w.note("reconciler failed: " + err.Error())
		return ReconcileRequest{}, false
	}
	r := ReconcileRequest{Attempt: rec.N, Verdict: out.Verdict, Response: out.Response, By: "reconciler"}
	if out.Verdict == activities.VerdictNone {
		w.note("reconciler could not tell; waiting for a verdict")
		return ReconcileRequest{}, false
	}
	if err := w.checkVerdict(r); err != nil {
		w.note("reconciler verdict ignored: " + err.Error())
		return ReconcileRequest{}, false
	}
	w.note("reconciler verdict " + string(out.Verdict))
	return r, true
}

// backoff waits d, or until the scope ends. It reports whether the wait
// ran its course.
func (w *action) backoff(d time.Duration) bool {
	w.setState(StateBackingOff, "", "")
	_, _ = workflow.AwaitWithTimeout(w.ctx, d, func() bool { return w.cancelReq != nil })
	return !w.scopeEnded()
}

// jitter is a deterministic uniform number in [0, 1) for the current
// attempt: replay computes the same value, and no history event is needed.
func (w *action) jitter() float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(w.info.WorkflowExecution.RunID))
	_, _ = h.Write([]byte{byte(w.status.Used), byte(w.status.Used >> 8)})
	return float64(h.Sum64()>>11) / float64(1<<53)
}

func (w *action) endWith(s State, c recovery.Classification) ActionResult {
	if w.cancelReq != nil {
		w.note("cancel arrived as the response committed: the response stands")
	}
	return w.end(s, string(c.Class), c.Reason)
}

func (w *action) endCanceled() ActionResult {
	w.status.Origin = w.origin
	w.count("durallm.cancellations", "origin", string(w.origin))
	return w.end(StateCanceled, string(recovery.Canceled), string(w.origin))
}

// end makes the one terminal transition. Signals still queued are
// recorded and ignored.
func (w *action) end(s State, outcome, reason string) ActionResult {
	w.status.Outcome, w.status.Reason = outcome, reason
	w.setState(s, outcome, "")
	for {
		var c CancelRequest
		if !w.cancelCh.ReceiveAsync(&c) {
			break
		}
		w.note("cancel (" + string(c.Origin) + ") after the terminal state: ignored")
	}
	for {
		var r ReconcileRequest
		if !w.reconcileCh.ReceiveAsync(&r) {
			break
		}
		w.note("reconcile " + string(r.Verdict) + " after the terminal state: ignored")
	}
	w.details()
	res := ActionResult{Status: w.status, ResultRef: w.resRef}
	if s == StateCompleted || s == StateCompletedPartial || s == StateReconciled {
		res.Response = w.response
	}
	w.log.Info("action ended", "state", string(s), "outcome", outcome, "reason", reason, "attempts", w.status.Used)
	return res
}

// setState moves the state and keeps the search attributes and current
// details in step.
func (w *action) setState(s State, outcome, route string) {
	w.status.State = s
	updates := []temporal.SearchAttributeUpdate{AttrState.ValueSet(string(s))}
	if outcome != "" {
		updates = append(updates, AttrOutcome.ValueSet(outcome))
	}
	if route != "" {
		updates = append(updates, AttrRoute.ValueSet(route))
	}
	if w.plan.SearchAttributes {
		if err := workflow.UpsertTypedSearchAttributes(w.ctx, updates...); err != nil {
			w.log.Warn("search attribute update failed", "error", err)
		}
	}
	w.details()
}

// details writes the timeline as the workflow's current details, shown in
// the Temporal UI.
func (w *action) details() {
	var b strings.Builder
	fmt.Fprintf(&b, "**%s**", w.status.State)
	if w.status.Reason != "" {
		fmt.Fprintf(&b, " (%s)", w.status.Reason)
	}
	fmt.Fprintf(&b, " · %d of %d attempts\n\n", w.status.Used, w.status.Budget)
	if len(w.status.Attempts) > 0 {
		b.WriteString("| # | route | why | class | reason | conn | stream | status |\n|---|---|---|---|---|---|---|---|\n")
		for _, r := range w.status.Attempts {
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %d | %d |\n", r.N, r.Route, r.Why,
				r.Classification.Class, r.Classification.Reason, r.Evidence.ConnRef, r.Evidence.StreamID, r.Evidence.Status)
		}
	}
	if w.status.AwaitingAttempt > 0 {
		fmt.Fprintf(&b, "\nAwaiting a reconcile verdict for attempt %d.\n", w.status.AwaitingAttempt)
	}
	workflow.SetCurrentDetails(w.ctx, b.String())
}

// summary is the one-line activity summary shown in the UI, e.g.
// "attempt 2 · transport retry · openai/gpt-4o-mini · fresh connection after GOAWAY last=41".
func summary(n int, nx nextAttempt, r activities.RouteInfo) string {
	parts := []string{"attempt " + strconv.Itoa(n), nx.why, r.Kind + "/" + r.Model}
	if nx.detail != "" {
		parts = append(parts, nx.detail)
	}
	return strings.Join(parts, " · ")
}

func freshDetail(ev recovery.Evidence) string {
	switch {
	case ev.GoAway != nil:
		return fmt.Sprintf("fresh connection after GOAWAY last=%d", ev.GoAway.LastStreamID)
	case ev.RSTStream != nil:
		return "fresh connection after RST_STREAM " + ev.RSTStream.String()
	default:
		return "fresh connection"
	}
}

// count increments a workflow counter. The SDK's workflow metrics handler
// records nothing during replay, so a counter counts each event once.
func (w *action) count(name, tag, value string) {
	workflow.GetMetricsHandler(w.ctx).WithTags(map[string]string{tag: value}).Counter(name).Inc(1)
}

func reconcileLabel(v ReconcileRequest) string {
	if v.By == "timeout" {
		return "timeout"
	}
	return string(v.Verdict)
}

func reconcileEnd(v ReconcileRequest) string {
	if v.By == "timeout" {
		return "reconcile_timeout"
	}
	return "abandoned"
}

func appendUnique(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(append([]string(nil), s...), v)
}

func routeNames(rs []activities.RouteInfo) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Name
	}
	return strings.Join(names, ", ")
}
