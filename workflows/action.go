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
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

const (
	defaultMaxAttempts      = 4
	maxMaxAttempts          = 50
	defaultDeadline         = 5 * time.Minute
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
	// sizing is the request's part of each attempt's worst case, for the
	// budget (status.Ledger, nil without one).
	sizing sizing

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
	if in.Budget != nil {
		w.status.Ledger = &Ledger{Limit: *in.Budget}
		w.sizing = newSizing(in.Request)
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
	if pl, fits := w.position(&cur, AttemptRecord{}).spendFor(&cur.next, 0, ""); !fits {
		// Not even the first attempt fits: nothing is sent.
		for _, n := range pl.notes {
			w.note(n)
		}
		return w.end(pl.end, pl.reason, pl.reason)
	}
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

// step decides what follows one attempt (decide, the one place that
// does) and carries it out: it records the decision, then ends the action
// (done) or moves cur to the next attempt, after any wait the decision
// needs (a verdict; a backoff is run's).
func (w *action) step(cur *cursor, rec AttemptRecord) (res ActionResult, done bool) {
	// The budget's reservation settles before the decision, which sizes
	// the next attempt against it; an attempt that may have run holds
	// its reservation until what follows it is known (its verdict).
	held := heldUntilVerdict(rec.Classification.Class)
	if !held {
		w.settle(rec.N, w.chargeOf(rec))
	}
	pl := decide(rec.Classification, rec.Evidence, w.position(cur, rec))
	if held && pl.d.Next != DecideAwait {
		w.settle(rec.N, w.chargeOf(rec))
	}
	for _, n := range pl.notes {
		w.note(n)
	}
	if pl.misdirected {
		w.misdirected = true
	}
	switch pl.d.Next {
	case DecideFinish:
		if pl.askJournal && w.plan.Reconciler {
			if res, ok := w.recoverLostPartial(rec); ok {
				return res, true
			}
		}
		w.record(pl.d)
		if w.cancelReq != nil {
			w.note("cancel arrived as the response committed: the response stands")
		}
		if pl.end == StateCompletedPartial && w.response == nil && w.resRef == "" {
			// Committed on a worker that was lost: its text went to the
			// subscribers of that worker and is not in history.
			w.response = &providers.Response{Partial: true, Incomplete: providers.IncompleteWorkerLost}
		}
		return w.end(pl.end, pl.outcome, pl.reason), true
	case DecideStop:
		w.record(pl.d)
		return w.endPlan(pl), true
	case DecideAwait:
		w.record(pl.d)
		return w.afterVerdict(cur, rec, pl.attempt.avoid)
	}
	w.record(pl.d)
	if pl.d.Next == DecideReplay {
		w.count("durallm.ambiguous_replays", "reason", "idempotency_policy")
	}
	w.move(cur, pl)
	return ActionResult{}, false
}

// position is where the action stands as the attempt rec ends on cur.
func (w *action) position(cur *cursor, rec AttemptRecord) position {
	return position{
		origin: w.origin, used: w.status.Used, budget: w.in.MaxAttempts,
		routes: w.routes, route: cur.route, tries: cur.tries, retriesPerRoute: w.in.RetriesPerRoute,
		waits: cur.waits, backoff: w.in.Backoff, jitter: w.jitter(), remaining: w.deadline.Sub(workflow.Now(w.ctx)),
		avoid: cur.next.avoid, mayReplay: w.mayReplay(w.routes[cur.route], rec),
		ledger: w.status.Ledger, sizing: w.sizing,
	}
}

// move puts cur where pl says the next attempt goes.
func (w *action) move(cur *cursor, pl plan) {
	cur.route, cur.tries, cur.waits, cur.next = pl.route, pl.tries, pl.waits, pl.attempt
}

// endPlan makes the terminal transition pl names.
func (w *action) endPlan(pl plan) ActionResult {
	if pl.end == StateCanceled {
		return w.endCanceled()
	}
	return w.end(pl.end, pl.outcome, pl.reason)
}

// record records what follows the latest attempt and emits its one
// "llm.attempt" event, which now says exactly what its record says: the
// event's next, why, next_route and wait are the decision's.
func (w *action) record(d Decision) {
	rec := &w.status.Attempts[len(w.status.Attempts)-1]
	rec.Decision = d
	if workflow.IsReplaying(w.ctx) {
		return
	}
	extra := []slog.Attr{slog.String("next", d.Next), slog.String("why", d.Why)}
	if d.Route != "" {
		extra = append(extra, slog.String("next_route", d.Route))
	}
	if d.Wait > 0 {
		extra = append(extra, slog.Duration("wait", d.Wait))
	}
	extra = append(extra, spendAttrs(*rec)...)
	evidence.LogAttempt(context.Background(), w.events, rec.Evidence, rec.Classification, extra...)
}

// nextAttempt says how the next attempt is made and why.
type nextAttempt struct {
	why, detail string
	avoid       []string
	fresh       bool
	wait        time.Duration
	// grant is what the action's budget lets it have; nil without one.
	grant *grant
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
		if b := w.in.Budget; b != nil && b.Cost > 0 && r.Prices == nil {
			w.note("route " + r.Name + " skipped: it has no prices, and the action has a cost budget")
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

func (w *action) endCanceled() ActionResult {
	w.status.Origin = w.origin
	w.count("durallm.cancellations", "origin", string(w.origin))
	return w.end(StateCanceled, string(evidence.Canceled), string(w.origin))
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

// count increments a workflow counter. The SDK's workflow metrics handler
// records nothing during replay, so a counter counts each event once.
func (w *action) count(name, tag, value string) {
	workflow.GetMetricsHandler(w.ctx).WithTags(map[string]string{tag: value}).Counter(name).Inc(1)
}
