// Package workflows holds LLMAction, the workflow that owns one user
// action: its attempt budget, overall deadline, cancellation scope, route
// choice, reconciliation wait and terminal state (docs/contract.md sections 1, 4
// and 5). It decides; the CallModel activity acts; the recovery engine
// observes.
//
// Everything here is deterministic workflow code: time comes from
// workflow.Now, randomness from a hash of the run id, and all waiting goes
// through Temporal timers and Await.
package workflows

import (
	"context"
	"errors"
	"fmt"
	"github.com/durallm/durallm/attempt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

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
// type InvalidInputType) only when the input is invalid, before anything
// is dispatched. It emits attempt events to slog.Default(); a worker binds
// its own logger with New.
func LLMAction(ctx workflow.Context, in ActionInput) (ActionResult, error) {
	return runAction(ctx, in, Options{})
}

// Options are the worker-side settings of LLMAction. They are not part of
// the workflow's input or history.
type Options struct {
	// Events receives each attempt's one "llm.attempt" event, emitted once
	// the workflow has decided what follows the attempt, so the event says
	// exactly what the attempt's record in history says. Never during
	// replay. Nil means slog.Default().
	Events *slog.Logger
}

// New returns LLMAction bound to o. Register it under WorkflowName:
//
//	r.RegisterWorkflowWithOptions(workflows.New(o), workflow.RegisterOptions{Name: workflows.WorkflowName})
func New(o Options) func(workflow.Context, ActionInput) (ActionResult, error) {
	return func(ctx workflow.Context, in ActionInput) (ActionResult, error) { return runAction(ctx, in, o) }
}

func runAction(ctx workflow.Context, in ActionInput, o Options) (ActionResult, error) {
	w, err := newAction(ctx, in, o)
	if err != nil {
		return ActionResult{}, err
	}
	return w.run(), nil
}

// action is one run's state. Fields are touched only by the workflow's
// coroutines, which Temporal runs one at a time.
type action struct {
	ctx    workflow.Context // the workflow's own; canceled by Temporal cancellation
	actx   workflow.Context // disconnected: activities and cleanup outlive a cancel request
	in     ActionInput
	needs  providers.Capabilities // what the action declares plus what its request uses
	info   *workflow.Info
	log    log.Logger
	events *slog.Logger

	status   Status
	plan     attempt.Plan
	routes   []attempt.RouteInfo
	deadline time.Time
	response *providers.Response
	resRef   string
	// misdirected: an attempt of this action got a 421, so any later 421,
	// on any route, is misdirected_repeated.
	misdirected bool

	cancelReq *CancelRequest
	origin    CancelOrigin // set once the scope has ended
	verdict   *ReconcileRequest

	cancelCh, reconcileCh workflow.ReceiveChannel
}

func newAction(ctx workflow.Context, in ActionInput, o Options) (*action, error) {
	in = in.WithDefaults(workflow.GetInfo(ctx).WorkflowExecution.ID)
	if err := in.Validate(); err != nil {
		var ie *InputError
		msg := err.Error()
		if errors.As(err, &ie) {
			msg = ie.problems()
		}
		return nil, temporal.NewNonRetryableApplicationError(msg, InvalidInputType, err)
	}
	events := o.Events
	if events == nil {
		events = slog.Default()
	}
	actx, _ := workflow.NewDisconnectedContext(ctx)
	info := workflow.GetInfo(ctx)
	w := &action{
		ctx: ctx, actx: actx, in: in, info: info, log: workflow.GetLogger(ctx), events: events,
		needs:    in.Needs.Union(in.Request.Needs()),
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

func (w *action) note(what string) {
	w.status.Notes = append(w.status.Notes, Note{At: workflow.Now(w.ctx), What: what})
}

// run is the state machine (docs/contract.md section 4): attempt, then
// step to what the attempt's class allows, until a terminal state. It
// returns exactly once, with the terminal result.
func (w *action) run() ActionResult {
	if !w.loadPlan() {
		return w.end(StateFailed, "no_route", "no route satisfies the action's needs")
	}
	w.setState(StateQueued, "", "")
	cur := cursor{next: nextAttempt{why: "primary"}}
	for {
		if w.scopeEnded() {
			return w.endCanceled()
		}
		rec := w.attempt(w.routes[cur.route], cur.next)
		if res, done := w.step(&cur, rec); done {
			return res
		}
		if wait := cur.next.wait; wait > 0 {
			w.status.Attempts[len(w.status.Attempts)-1].BackoffAfter = wait
			if !w.backoff(wait) {
				return w.endCanceled()
			}
		}
	}
}

// cursor is where an action stands between attempts: the route in use,
// the retries it has had, the backoff waits so far (for the backoff
// window) and how the next attempt is to be made.
type cursor struct {
	route, tries, waits int
	next                nextAttempt
}

// step applies the contract's next-step table (docs/contract.md section
// 4.2) to one attempt: it records the attempt's Decision and either ends
// the action (done) or moves cur to the next attempt.
func (w *action) step(cur *cursor, rec AttemptRecord) (res ActionResult, done bool) {
	c := rec.Classification
	route := w.routes[cur.route]
	if w.origin != "" && c.Class != recovery.Completed && c.Class != recovery.CommittedPartial {
		w.decide(Decision{Next: DecideStop, Why: "scope_ended_" + string(w.origin)})
		return w.endCanceled(), true
	}
	if c.Class == recovery.Misdirected {
		w.misdirected = true
	}
	avoid := cur.next.avoid
	if rec.Evidence.ConnRef != "" && (c.FreshConnection || rec.Evidence.GoAway != nil) {
		avoid = appendUnique(avoid, rec.Evidence.ConnRef)
	}
	stop := func(s State, reason string) (ActionResult, bool) {
		w.decide(Decision{Next: DecideStop, Why: reason})
		return w.end(s, string(c.Class), reason), true
	}
	// again makes one more attempt, as d says and nx describes, unless the
	// budget is spent.
	again := func(d Decision, nx nextAttempt) (ActionResult, bool) {
		if !w.another(d) {
			return w.end(StateFailed, string(c.Class), "budget_exhausted"), true
		}
		cur.next = nx
		return ActionResult{}, false
	}
	// fallBack moves to route j.
	fallBack := func(j int, after string) (ActionResult, bool) {
		res, done := again(Decision{Next: DecideFallback, Why: c.Reason, Route: w.routes[j].Name},
			nextAttempt{why: "fallback", detail: "after " + after + " on " + route.Name})
		if !done {
			cur.route, cur.tries = j, 0
		}
		return res, done
	}
	// fallBackOrStop falls back to the next route that can serve, or ends
	// the action when there is none.
	fallBackOrStop := func(after string) (ActionResult, bool) {
		j, ok := w.fallbackFrom(cur.route, c)
		if !ok {
			return stop(StateFailed, c.Reason+": no route to fall back to")
		}
		return fallBack(j, after)
	}

	switch c.Class {
	case recovery.Completed, recovery.CommittedPartial:
		if c.Class == recovery.CommittedPartial && rec.Evidence.Activity != "" && w.plan.Reconciler {
			// Committed on a worker that was lost: its text is not in
			// history, but the journal may hold the whole response.
			if v, ok := w.runReconciler(rec); ok && v.Verdict == attempt.VerdictCompleted {
				w.decide(Decision{Next: DecideFinish, Why: c.Reason + ": the response from " + v.By})
				last := &w.status.Attempts[len(w.status.Attempts)-1]
				last.Verdict, last.VerdictBy = v.Verdict, v.By
				w.countVerdict(v.Verdict, v.By)
				w.response, w.resRef = v.Response, v.ResultRef
				return w.end(StateReconciled, string(attempt.VerdictCompleted), "reconciled"), true
			}
		}
		w.decide(Decision{Next: DecideFinish, Why: c.Reason})
		s := StateCompleted
		if c.Class == recovery.CommittedPartial {
			s = StateCompletedPartial
		}
		return w.endWith(s, c), true
	case recovery.Rejected, recovery.ContentFiltered:
		return stop(StateRejected, c.Reason)
	case recovery.MisdirectedRepeated:
		return stop(StateFailed, c.Reason)

	case recovery.Misdirected:
		return again(Decision{Next: DecideRetry, Why: "fresh connection after 421", Route: route.Name},
			nextAttempt{why: "421 retry", detail: "fresh connection after 421", avoid: avoid, fresh: true})
	case recovery.Refused:
		if c.RouteMisconfigured {
			return fallBackOrStop(c.Reason)
		}
		return again(Decision{Next: DecideRetry, Why: c.Reason, Route: route.Name},
			nextAttempt{why: "transport retry", detail: freshDetail(rec.Evidence), avoid: avoid})

	case recovery.Ambiguous, recovery.Canceled:
		// A canceled attempt with the scope still open is never expected
		// (only the workflow asks Temporal to cancel one); the request may
		// have left, so it waits for a verdict too.
		if c.Class == recovery.Ambiguous && w.mayReplay(route, rec) {
			res, done := again(Decision{Next: DecideReplay, Why: "route honours Idempotency-Key", Route: route.Name},
				nextAttempt{why: "replay", detail: "route honours Idempotency-Key", avoid: avoid})
			if !done {
				w.count("durallm.ambiguous_replays", "reason", "idempotency_policy")
			}
			return res, done
		}
		return w.afterVerdict(cur, rec, avoid)

	case recovery.EmptyResponse, recovery.IncompatibleRoute:
		return fallBackOrStop(string(c.Class))

	default: // unsent, throttled, upstream_error
		j, canFall := w.fallbackFrom(cur.route, c)
		canFall = canFall && c.Fallback
		same := c.SameRoute && (cur.tries < w.in.RetriesPerRoute || !canFall)
		cur.waits++
		wait, waitOK := w.in.Backoff.Delay(cur.waits, w.jitter(), c.RetryAfter, w.deadline.Sub(workflow.Now(w.ctx)))
		switch {
		case same && waitOK:
			res, done := again(Decision{Next: DecideRetry, Why: c.Reason, Route: route.Name, Wait: wait},
				nextAttempt{why: "retry", detail: "after " + string(c.Class), avoid: avoid, wait: wait})
			if !done {
				cur.tries++
			}
			return res, done
		case canFall:
			// A different provider need not wait out this one's pushback.
			return fallBack(j, string(c.Class))
		case same:
			return stop(StateFailed, "retry_after_beyond_deadline")
		default:
			return stop(StateFailed, c.Reason)
		}
	}
}

// countVerdict counts an applied verdict by its source: "journal",
// "reconciler", "person", or "timeout" when the wait ran out and nobody
// decided. Both are from fixed sets, so they are safe label values.
func (w *action) countVerdict(verdict attempt.Verdict, from string) {
	workflow.GetMetricsHandler(w.ctx).WithTags(map[string]string{"verdict": string(verdict), "by": from}).Counter("durallm.reconciliations").Inc(1)
}

// afterVerdict waits for a verdict on an ambiguous attempt and applies
// it (docs/contract.md section 5): the action ends, or goes on with
// another attempt within the same budget.
func (w *action) afterVerdict(cur *cursor, rec AttemptRecord, avoid []string) (ActionResult, bool) {
	c := rec.Classification
	w.decide(Decision{Next: DecideAwait, Why: c.Reason})
	v, from, end := w.reconcile(rec)
	switch end {
	case scopeEndedWhileWaiting:
		return w.endCanceled(), true
	case waitTimedOut:
		w.countVerdict("timeout", from)
		return w.end(StateIndeterminate, string(recovery.Ambiguous), "reconcile_timeout"), true
	}
	w.countVerdict(v.Verdict, from)
	last := &w.status.Attempts[len(w.status.Attempts)-1] // the attempt reconciled
	last.Verdict, last.VerdictBy = v.Verdict, from
	switch v.Verdict {
	case attempt.VerdictCompleted:
		w.response, w.resRef = v.Response, v.ResultRef
		return w.end(StateReconciled, string(attempt.VerdictCompleted), "reconciled"), true
	case attempt.VerdictNotExecuted, attempt.VerdictAllowReplay:
		if w.status.Used >= w.in.MaxAttempts {
			return w.end(StateFailed, string(c.Class), "budget_exhausted"), true
		}
		w.count("durallm.ambiguous_replays", "reason", "verdict_"+string(v.Verdict))
		cur.next = nextAttempt{why: "retry after verdict " + string(v.Verdict), avoid: avoid}
		return ActionResult{}, false
	default:
		return w.end(StateIndeterminate, string(recovery.Ambiguous), "abandoned"), true
	}
}

// nextAttempt says how the next attempt is made and why.
type nextAttempt struct {
	why, detail string
	avoid       []string
	fresh       bool
	wait        time.Duration
}

// another records the decision to make one more attempt, unless the
// budget is spent: then the decision is to stop, and it reports false.
func (w *action) another(d Decision) bool {
	if w.status.Used >= w.in.MaxAttempts {
		w.decide(Decision{Next: DecideStop, Why: "budget_exhausted"})
		return false
	}
	w.decide(d)
	return true
}

// decide records what follows the latest attempt and emits its one
// "llm.attempt" event, which now says exactly what its record says.
func (w *action) decide(d Decision) {
	rec := &w.status.Attempts[len(w.status.Attempts)-1]
	rec.Decision = d
	if workflow.IsReplaying(w.ctx) {
		return
	}
	extra := []slog.Attr{slog.String("decision", d.Next), slog.String("decision_why", d.Why)}
	if d.Route != "" {
		extra = append(extra, slog.String("next_route", d.Route))
	}
	if d.Wait > 0 {
		extra = append(extra, slog.Duration("wait", d.Wait))
	}
	recovery.LogAttempt(context.Background(), w.events, rec.Evidence, rec.Classification, extra...)
}

// fallbackFrom finds the route to fall back to from route ri after c:
// the next one in order, and after context_length_exceeded the next one
// that declares a larger context than ri's (a route that declares none is
// no evidence of a larger one). Routes passed over are noted.
func (w *action) fallbackFrom(ri int, c recovery.Classification) (int, bool) {
	larger := c.Class == recovery.IncompatibleRoute && c.Reason == string(recovery.SignalContextTooLong)
	for j := ri + 1; j < len(w.routes); j++ {
		if larger && w.routes[j].Capabilities.ContextTokens <= w.routes[ri].Capabilities.ContextTokens {
			w.note(fmt.Sprintf("route %s skipped for fallback: context_tokens %d is not larger than %s's %d", w.routes[j].Name, w.routes[j].Capabilities.ContextTokens, w.routes[ri].Name, w.routes[ri].Capabilities.ContextTokens))
			continue
		}
		return j, true
	}
	return 0, false
}

// loadPlan asks the worker for the routes' capabilities and keeps those
// that satisfy the action's needs (declared, and used by the request), in
// order, noting why others were skipped.
func (w *action) loadPlan() bool {
	lctx := workflow.WithLocalActivityOptions(w.actx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	if err := workflow.ExecuteLocalActivity(lctx, attempt.DescribeRoutes, attempt.PlanInput{Routes: w.in.Routes}).Get(lctx, &w.plan); err != nil {
		w.note("describe routes failed: " + err.Error())
		return false
	}
	for _, name := range w.plan.Unknown {
		w.note("route " + name + " skipped: not configured on the worker")
	}
	for _, r := range w.plan.Routes {
		if ok, missing := r.Capabilities.Satisfies(w.needs); !ok {
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
		timeout = defaultAttemptTimeout
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
		AttemptID:      w.info.WorkflowExecution.RunID + "-" + strconv.Itoa(n),
		IdempotencyKey: w.in.IdempotencyKey, Route: route.Name, Request: w.in.Request,
		Avoid: nx.avoid, FreshConnection: nx.fresh, AfterMisdirected: w.misdirected,
		Timeout: timeout,
	}
	queue := min(w.in.QueueTimeout, remaining)
	now := workflow.Now(w.ctx)
	rec := AttemptRecord{N: n, Route: route.Name, Why: nx.why, Scheduled: now, Deadline: now.Add(queue + timeout + attemptGrace)}
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
		if out.Evidence.Activity == recovery.ActivityFailed {
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
	case out.Classification.Class == recovery.CommittedPartial:
		// Committed on a worker that was lost: its text went to the
		// subscribers of that worker and is not in history.
		w.response, w.resRef = &providers.Response{Partial: true, Incomplete: providers.IncompleteWorkerLost}, ""
	}
	w.log.Info("attempt finished", "attempt", n, "route", route.Name, "classification", string(rec.Classification.Class), "reason", rec.Classification.Reason)
	return rec
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
	ev := recovery.Evidence{ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID, Route: in.Route, AfterMisdirected: in.AfterMisdirected}
	switch {
	case errors.As(err, &canceled):
		// Canceled before a worker ran it, or by a worker that sent no
		// outcome: the workflow asked, so it is the scope.
		ev.Canceled, ev.Stop = true, recovery.StopScope
	case errors.As(err, &timeout):
		if timeout.HasLastHeartbeatDetails() {
			var p attempt.Progress
			if timeout.LastHeartbeatDetails(&p) == nil {
				ev.ConnRef, ev.ContentStarted, ev.ResponseBytes = p.ConnRef, p.ContentStarted, p.ResponseBytes
			}
		}
		switch timeout.TimeoutType() {
		case enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START:
			ev.Activity = recovery.ActivityQueueTimeout
		case enumspb.TIMEOUT_TYPE_HEARTBEAT:
			ev.Activity = recovery.ActivityWorkerLost
		default:
			ev.Activity = recovery.ActivityTimedOut
		}
	default:
		ev.Activity = recovery.ActivityFailed
	}
	return attempt.Outcome{Evidence: ev, Classification: recovery.Classify(ev)}
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
// from says who decided: attempt.ByJournal or attempt.ByReconciler for
// the worker's reconciler, "person" for a verdict sent by a signal or
// Update (whatever its By says, which the notes keep).
func (w *action) reconcile(rec AttemptRecord) (v ReconcileRequest, from string, end waitEnd) {
	w.status.AwaitingAttempt = rec.N
	w.verdict = nil
	w.setState(StateAwaitingReconciliation, string(recovery.Ambiguous), rec.Route)
	if w.plan.Reconciler {
		if v, ok := w.runReconciler(rec); ok {
			w.status.AwaitingAttempt = 0
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
	w.status.AwaitingAttempt = 0
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

func (w *action) runReconciler(rec AttemptRecord) (ReconcileRequest, bool) {
	// The built-in reconciler may wait for an attempt that can still end
	// on a live worker, until the attempt's deadline: the activity's own
	// timeout leaves room for that.
	ctx := workflow.WithActivityOptions(w.actx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute + max(0, rec.Deadline.Sub(workflow.Now(w.ctx))),
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
		Summary:             "reconcile attempt " + strconv.Itoa(rec.N),
	})
	var out attempt.ReconcileOutput
	err := workflow.ExecuteActivity(ctx, attempt.Reconcile, attempt.ReconcileInput{
		ActionRef: w.status.ActionRef, IdempotencyKey: w.in.IdempotencyKey, Attempt: rec.N,
		AttemptID: rec.Evidence.AttemptID, Route: rec.Route, Evidence: rec.Evidence,
	}).Get(ctx, &out)
	if out.JournalState != "" {
		w.attemptRecord(rec.N).JournalState = out.JournalState
	}
	if err != nil {
		w.note("reconciler failed: " + err.Error())
		return ReconcileRequest{}, false
	}
	by := out.By
	if by == "" {
		by = attempt.ByReconciler
	}
	r := ReconcileRequest{Attempt: rec.N, Verdict: out.Verdict, Response: out.Response, ResultRef: out.ResultRef, By: by}
	if out.Verdict == attempt.VerdictNone {
		w.note("reconciler (" + by + ") could not tell: " + out.Note)
		return ReconcileRequest{}, false
	}
	if err := validVerdict(r); err != nil {
		w.note("reconciler verdict ignored: " + err.Error())
		return ReconcileRequest{}, false
	}
	w.note("reconciler verdict " + string(out.Verdict) + " by " + by)
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
	switch s {
	case StateCompleted, StateCompletedPartial, StateReconciled, StateRejected, StateCanceled:
		// The answer; for a rejection the provider's error object, for a
		// cancel after the commit the text delivered (docs/contract.md
		// section 6.4); nil when there is none.
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
	// Queued is never seen (see attempt.StateUpsertsSkipQueued); the
	// plan says whether this history upserted it.
	skip := s == StateQueued && w.plan.StateUpserts >= attempt.StateUpsertsSkipQueued
	if w.plan.SearchAttributes && !skip {
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
		b.WriteString("| # | route | why | class | reason | conn | stream | status | journal | verdict |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range w.status.Attempts {
			verdict := string(r.Verdict)
			if r.VerdictBy != "" {
				verdict += " by " + r.VerdictBy
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %d | %d | %s | %s |\n", r.N, r.Route, r.Why,
				r.Classification.Class, r.Classification.Reason, r.Evidence.ConnRef, r.Evidence.StreamID, r.Evidence.Status,
				r.JournalState, verdict)
		}
	}
	if w.status.AwaitingAttempt > 0 {
		fmt.Fprintf(&b, "\nAwaiting a reconcile verdict for attempt %d.\n", w.status.AwaitingAttempt)
	}
	workflow.SetCurrentDetails(w.ctx, b.String())
}

// summary is the one-line activity summary shown in the UI, e.g.
// "attempt 2 · transport retry · openai/gpt-4o-mini · fresh connection after GOAWAY last=41".
func summary(n int, nx nextAttempt, r attempt.RouteInfo) string {
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
// attemptRecord is attempt n's record in the timeline (the last one, if
// none has that number).
func (w *action) attemptRecord(n int) *AttemptRecord {
	for i := range w.status.Attempts {
		if w.status.Attempts[i].N == n {
			return &w.status.Attempts[i]
		}
	}
	return &w.status.Attempts[len(w.status.Attempts)-1]
}

func (w *action) count(name, tag, value string) {
	workflow.GetMetricsHandler(w.ctx).WithTags(map[string]string{tag: value}).Counter(name).Inc(1)
}

func appendUnique(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(append([]string(nil), s...), v)
}

func routeNames(rs []attempt.RouteInfo) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Name
	}
	return strings.Join(names, ", ")
}
