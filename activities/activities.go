// Package activities adapts the recovery engine and the provider layer to
// Temporal: one CallModel execution is one attempt (docs/contract.md section 1).
//
// CallModel returns the attempt's classified outcome as data. The only
// error it returns is a cancellation when the action's own scope ended: it
// wraps ctx.Err() with %w, and a temporal.CanceledError whose details are
// the outcome, so Temporal records a cancellation rather than a failure
// and the timeline keeps the attempt's evidence. A worker shutdown or an
// activity pause is not the action's scope: the attempt's outcome (a
// committed partial, an ambiguous or unsent attempt) is returned as data.
// Temporal must never retry it: the workflow schedules it with
// RetryPolicy.MaximumAttempts = 1 and owns the only budget.
package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"
	"log/slog"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
)

// Activities holds the worker-side dependencies of durallm's activities.
// Register it with worker.RegisterActivity(&Activities{...}); every
// exported method is an activity, so it has no other exported methods. It is safe for concurrent use once built.
type Activities struct {
	// Engine sends every attempt. Required.
	Engine *recovery.Engine
	// InsecureEngine sends attempts of routes with InsecureSkipVerify set;
	// nil when no route opts out of TLS verification.
	InsecureEngine *recovery.Engine
	// Routes are the configured routes by name. Keys never leave the
	// worker: the workflow refers to routes by name only.
	Routes map[string]routes.Route
	// Reconciler, when set, is asked for application evidence before an
	// ambiguous action waits for a person or program, after the journal.
	// Nil means none.
	Reconciler Reconciler
	// Journal, when set, is where each attempt's end is recorded before
	// the activity reports it (a received response, or an exchange that
	// ended unanswered), and what the built-in reconciler reads first for
	// every ambiguous attempt. Every worker of a task queue must share it.
	// Nil means none.
	Journal journal.Journal
	// BeforeReport, when set, is called with each outcome after it is
	// journaled and before the activity returns it: a hook for tests that
	// must hold the report (a worker killed between the two). Nil in
	// production.
	BeforeReport func(attempt.Outcome)
	// Streams receives streamed deltas while an attempt runs. Nil means
	// deltas are not forwarded (the final response still carries them).
	Streams *Streams
	// StreamURL, when set, is where other processes reach this worker's
	// stream endpoint (http://host:port, no path). A streamed attempt's
	// heartbeats carry it (attempt.Progress.StreamURL). Empty means none
	// is advertised.
	StreamURL string
	// HeartbeatEvery is how often an attempt heartbeats. Zero means 250ms,
	// so a cancellation reaches the HTTP request within about a second
	// (together with the worker's heartbeat throttle).
	HeartbeatEvery time.Duration
	// SearchAttributes says the Temporal namespace has durallm's search
	// attributes registered (DurallmState, DurallmOutcome, DurallmRoute,
	// all Keyword), so workflows keep them current. False means they are
	// not written: upserting an unregistered attribute fails the workflow
	// task.
	SearchAttributes bool
	// Results keeps responses larger than LargeResponseBytes out of
	// history: the outcome then carries a reference instead. Nil means
	// responses always travel inline.
	Results resultstore.Store
	// LargeResponseBytes is the JSON size above which a response goes to
	// Results. Zero means resultstore.DefaultThreshold (256 KiB).
	LargeResponseBytes int
	// StopGrace is how long a running attempt may go on once its worker
	// starts a graceful stop. Past it the activity ends the attempt itself
	// (its evidence intact) and returns, while the worker can still report
	// the outcome: the SDK fails any result reported after its stop
	// timeout has canceled the worker's context. Set it below the worker's
	// stop timeout. Zero means 8s (the worker's default stop timeout is
	// 10s); negative means the attempt runs until the SDK cancels it.
	StopGrace time.Duration
	// Telemetry records per-attempt metrics. Nil means none.
	Telemetry *telemetry.Telemetry
	// Logger receives worker-side events (never content). Nil means
	// slog.Default().
	Logger *slog.Logger

	// lease overrides journalLease, for tests.
	lease time.Duration
}

// Reconciler looks for application evidence of whether an ambiguous
// attempt was executed: a stored result, a usage record, a provider
// lookup. It returns a Verdict, or VerdictNone when it cannot tell.
type Reconciler interface {
	Reconcile(ctx context.Context, in attempt.ReconcileInput) (attempt.ReconcileOutput, error)
}

// CallModel makes one attempt. See the package doc for its error contract.
//
// It never decides a class: everything it knows that the wire cannot show
// (the body's signal, why its context ended, a request refused before
// sending) goes to recovery as evidence, and the class Classify returns is
// final. The attempt's "llm.attempt" event is left to the workflow, which
// emits it once it has decided what comes next (Spec.DeferEvent).
func (a *Activities) CallModel(ctx context.Context, in attempt.Input) (attempt.Outcome, error) {
	route, known := a.Routes[in.Route]
	att := recovery.NewAttempt(recovery.Spec{
		ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID,
		IdempotencyKey: in.IdempotencyKey, Route: in.Route, Provider: route.Kind, Model: route.Model,
		Avoid: in.Avoid, FreshConnection: in.FreshConnection, AfterMisdirected: in.AfterMisdirected,
		Intermediary: route.Intermediary, DeferEvent: true,
		// The provider layer commits when content reaches the caller: for
		// a stream, the first content delta; for JSON, a usable body.
		ManualCommit: true,
	})
	if !known {
		// A route the workflow names but this worker does not know cannot
		// serve the action; another route may.
		ev, class := att.FinishWith(recovery.Facts{Unsendable: recovery.UnsendableNoRoute})
		return a.finish(ctx, in, route, attempt.Outcome{Evidence: ev, Classification: class}, providers.Usage{})
	}

	// One rule for the attempt's timeout (docs/workflow.md): the action's
	// attempt_timeout when it sets one, else the route's, never past the
	// deadline. The workflow has applied it; the exchange's own timer is
	// set from it, so a route default cannot cut a longer attempt short.
	if in.Timeout > 0 {
		route.AttemptTimeout = in.Timeout
	}

	// Heartbeats go on the activity's context: they end when Temporal
	// has lost the attempt, while the exchange may run on, and with it
	// the journal's sent record. The worker's own stop ends the exchange
	// after StopGrace either way, lost or not.
	stop := a.heartbeat(ctx, att, in.Request.Stream)
	ctx, detach := a.outliveLostAttempt(ctx, in)
	defer detach()
	ctx, release := a.endOnWorkerStop(ctx)
	defer release()
	stopSent := a.journalSent(ctx, in, att)
	var sink exchange.Sink
	if a.Streams != nil {
		sink = a.Streams.forAttempt(in.ActionRef, in.Attempt)
	}
	engine := a.Engine
	if route.InsecureSkipVerify && a.InsecureEngine != nil {
		engine = a.InsecureEngine
	}
	res, err := exchange.CallRoute(recovery.WithAttempt(ctx, att), engine, exchange.Call{Route: route, Request: in.Request, Sink: sink})
	stop()
	stopSent() // before the end is journaled: nothing may write Sent after it
	ev, class := att.FinishWith(facts(ctx, res, err))
	if a.Streams != nil {
		a.Streams.attemptEnded(in.ActionRef, class.Class)
	}
	out := attempt.Outcome{Evidence: ev, Classification: class}
	switch class.Class {
	case recovery.Completed, recovery.CommittedPartial:
		r := res.Response
		out.Response = &r
	case recovery.Rejected, recovery.ContentFiltered:
		// The provider's error object is the caller's answer (a gateway
		// passes it back); its message may quote the prompt, so it stays
		// in the response it belongs to (docs/contract.md section 7).
		if res.Response.Error != nil {
			out.Response = &providers.Response{Error: res.Response.Error}
		}
	case recovery.Canceled:
		// Canceled after the commit: the text already delivered stays
		// with the result (docs/contract.md section 6.4).
		if ev.ContentStarted {
			r := res.Response
			r.Partial, r.Raw = true, nil
			if r.Incomplete == "" {
				r.Incomplete = providers.IncompleteCanceled
			}
			out.Response = &r
		}
	}
	return a.finish(ctx, in, route, out, res.Response.Usage)
}

// ErrWorkerStopping is the cause an attempt's context is canceled with
// when its worker is stopping and StopGrace has passed.
var ErrWorkerStopping = errors.New("durallm: the worker is stopping")

// endOnWorkerStop returns a context that ends with ErrWorkerStopping once
// the worker has been stopping for StopGrace, so the attempt returns its
// outcome while the worker can still report it.
func (a *Activities) endOnWorkerStop(ctx context.Context) (context.Context, func()) {
	grace := a.StopGrace
	if grace == 0 {
		grace = 8 * time.Second
	}
	if grace < 0 || !activity.IsActivity(ctx) {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-activity.GetWorkerStopChannel(ctx):
		case <-done:
			return
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel(ErrWorkerStopping)
		case <-done:
		}
	}()
	return ctx, func() {
		close(done)
		cancel(nil)
	}
}

// outliveLostAttempt returns the context the exchange runs on. It ends
// when the activity's context does, with its cause, except when Temporal
// lost track of the attempt: the SDK cancels an activity whose heartbeat
// finds it gone (serviceerror.NotFound: it timed out on the server) or
// cannot reach the server for the heartbeat timeout (a server restart).
// Nobody asked the attempt to stop then, and cutting it would throw away
// an answer the provider is sending: the exchange runs on to its own
// deadline, its end goes to the journal before the (probably refused)
// report, and the built-in reconciler settles the action from there
// (docs/contract.md section 5.5).
//
// The causes that do stop the exchange are the ones that mean it:
// the workflow's cancellation (a temporal.CanceledError), the worker
// stopping, an operator's pause or reset, and a context ended without a
// cause (nothing tells it apart from a cancellation).
func (a *Activities) outliveLostAttempt(ctx context.Context, in attempt.Input) (context.Context, func()) {
	deadline, hasDeadline := ctx.Deadline()
	exch, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	if hasDeadline {
		var cancelTimer context.CancelFunc
		exch, cancelTimer = context.WithDeadline(exch, deadline)
		prev := cancel
		cancel = func(cause error) { prev(cause); cancelTimer() }
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		cause := context.Cause(ctx)
		if !temporalLost(cause) {
			cancel(cause)
			return
		}
		a.logger().Warn("Temporal lost track of the attempt (its heartbeat failed); the exchange runs on to its own deadline so its end reaches the journal",
			"action_ref", in.ActionRef, "attempt", in.Attempt, "attempt_id", in.AttemptID, "cause", cause)
	}()
	return exch, func() {
		close(done)
		cancel(nil)
	}
}

// temporalLost reports whether an activity context's cause says that
// Temporal lost track of the attempt, rather than that someone asked it to
// stop. See outliveLostAttempt.
func temporalLost(cause error) bool {
	var canceled *temporal.CanceledError
	switch {
	case cause == nil, cause == context.Canceled, cause == context.DeadlineExceeded,
		errors.As(cause, &canceled),
		errors.Is(cause, ErrWorkerStopping), errors.Is(cause, worker.ErrWorkerShutdown),
		errors.Is(cause, activity.ErrActivityPaused), errors.Is(cause, activity.ErrActivityReset):
		return false
	}
	return true
}

// facts gathers what the activity knows of an attempt that the wire
// cannot show.
func facts(ctx context.Context, res exchange.Result, err error) recovery.Facts {
	f := recovery.Facts{Signal: res.Signal, Stop: stopCause(ctx)}
	switch {
	case errors.Is(err, exchange.ErrUnsupported), errors.Is(err, exchange.ErrUnknownKind):
		f.Unsendable = recovery.UnsendableRoute
	case errors.Is(err, providers.ErrInvalidRequest):
		f.Unsendable = recovery.UnsendableInvalid
	}
	switch {
	case f.Signal != recovery.SignalNone:
	case res.Response.Partial:
		// The wire ended cleanly but the stream was cut: the provider
		// layer knows, the engine cannot.
		f.Signal = recovery.SignalStreamIncomplete
	case err != nil:
		// The adapter failed without saying why: whatever the wire says,
		// the body was not usable (for a clean 2xx, an executed request
		// with no answer).
		f.Signal = recovery.SignalEmptyResponse
	}
	return f
}

// stopCause says why the activity's context ended, from its cause: our
// own ErrWorkerStopping, or the Temporal SDK's worker.ErrWorkerShutdown
// when the worker stops, activity.ErrActivityPaused or ErrActivityReset
// when an operator intervenes, and a canceled error when the workflow
// asked.
func stopCause(ctx context.Context) recovery.StopCause {
	if ctx.Err() == nil {
		return ""
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrWorkerStopping), errors.Is(cause, worker.ErrWorkerShutdown):
		return recovery.StopWorkerShutdown
	case errors.Is(cause, activity.ErrActivityPaused), errors.Is(cause, activity.ErrActivityReset):
		return recovery.StopPaused
	default:
		return recovery.StopScope
	}
}

// finish records the attempt's metrics, keeps a large response out of
// history, and returns the outcome. A canceled attempt returns an error
// that Temporal records as a cancellation (it wraps ctx.Err() and a
// temporal.CanceledError) carrying the outcome as its details, so the
// workflow's timeline keeps the connection, the stream and whether content
// had been delivered.
func (a *Activities) finish(ctx context.Context, in attempt.Input, route routes.Route, out attempt.Outcome, usage providers.Usage) (attempt.Outcome, error) {
	a.Telemetry.RecordAttempt(ctx, telemetry.Attempt{
		Route: in.Route, Provider: route.Kind, Model: route.Model, Evidence: out.Evidence, Class: out.Classification,
		InputTokens: usage.PromptTokens, OutputTokens: usage.CompletionTokens,
	})
	if out.Classification.Class == recovery.Canceled && ctx.Err() != nil {
		return out, fmt.Errorf("durallm: attempt %d of %s canceled: %w (%w)", in.Attempt, in.ActionRef, ctx.Err(), temporal.NewCanceledError(out))
	}
	a.record(ctx, in, out)
	if a.BeforeReport != nil {
		a.BeforeReport(out)
	}
	a.storeLarge(ctx, &out)
	return out, nil
}

// record journals how the attempt ended, before it is reported: the
// response a worker received survives the report being lost. A journal
// that cannot be written is logged and counted, never an attempt's
// failure: the outcome still goes to Temporal.
func (a *Activities) record(ctx context.Context, in attempt.Input, out attempt.Outcome) {
	if a.Journal == nil {
		return
	}
	e := journal.Entry{AttemptID: in.AttemptID, ActionRef: in.ActionRef, Attempt: in.Attempt,
		Class: out.Classification.Class, Reason: out.Classification.Reason, At: time.Now()}
	switch {
	case out.Response != nil && out.Response.Error == nil:
		e.State, e.Response = journal.Received, out.Response
	case out.Classification.Class == recovery.Unsent, out.Classification.Class == recovery.Refused:
		// The engine's proof that the provider did not process it: if
		// this report is lost, the reconciler can still send the action
		// on.
		e.State = journal.NotProcessed
	case out.Evidence.RequestSent || out.Evidence.MaybeSent:
		e.State = journal.EndedUnanswered
	default:
		return // no request, no proof of one: nothing worth keeping
	}
	// A worker shutdown may have ended ctx; the entry must still be
	// written.
	if err := a.Journal.Record(context.WithoutCancel(ctx), e); err != nil {
		a.logger().Warn("attempt journal unavailable: the outcome is reported without it", "attempt_id", in.AttemptID, "error", err)
		a.Telemetry.JournalFailed(ctx)
	}
}

// The journal's sent record: how soon after the request leaves it is
// written, and how often it is renewed while the exchange runs. The
// renewals are how the built-in reconciler tells a live worker's attempt
// (worth waiting for) from a dead worker's (not).
const (
	journalSentPoll = 50 * time.Millisecond
	journalLease    = 2 * time.Second
)

// journalSent journals the attempt as Sent once its request is on the
// wire, and renews the entry every journalLease while the exchange runs,
// with the exchange's deadline. stop ends it and waits, so that no Sent
// is written after the attempt's end (journal.Journal). Failures are
// logged and counted like record's, once.
func (a *Activities) journalSent(ctx context.Context, in attempt.Input, att *recovery.Attempt) (stop func()) {
	if a.Journal == nil {
		return func() {}
	}
	deadline, _ := ctx.Deadline()
	var last time.Time
	failed := false
	// Not stopped by ctx: the caller's stop ends it, after the exchange.
	return onEachTick(journalSentPoll, nil, func() {
		if time.Since(last) < a.journalLease() || !att.OnTheWire() {
			return
		}
		last = time.Now()
		e := journal.Entry{AttemptID: in.AttemptID, ActionRef: in.ActionRef, Attempt: in.Attempt, State: journal.Sent, At: last, Deadline: deadline}
		if err := a.Journal.Record(context.WithoutCancel(ctx), e); err != nil && !failed {
			failed = true
			a.logger().Warn("attempt journal unavailable: the attempt goes on without its sent record", "attempt_id", in.AttemptID, "error", err)
			a.Telemetry.JournalFailed(ctx)
		}
	})
}

// onEachTick calls fn every interval, the first time after one interval,
// until stop is called or until ends (nil: never). stop waits for a call
// in progress, so fn never runs after stop returns.
func onEachTick(every time.Duration, until <-chan struct{}, fn func()) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-until:
				return
			case <-t.C:
			}
			fn()
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// storeLarge moves a response too large for history into the result
// store, leaving a reference. If the store fails, the response stays
// inline: Temporal may still accept it, and the answer is not lost.
func (a *Activities) storeLarge(ctx context.Context, out *attempt.Outcome) {
	if a.Results == nil || out.Response == nil {
		return
	}
	limit := a.LargeResponseBytes
	if limit <= 0 {
		limit = resultstore.DefaultThreshold
	}
	b, err := json.Marshal(out.Response)
	if err != nil || len(b) <= limit {
		return
	}
	ref, err := a.Results.Put(ctx, b)
	if err != nil {
		a.logger().Warn("large response kept inline: result store failed", "attempt_id", out.Evidence.AttemptID, "bytes", len(b), "error", err)
		return
	}
	out.Response, out.ResponseRef = nil, ref
}

func (a *Activities) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.Default()
}

// heartbeat records progress every HeartbeatEvery until stop is called.
// The heartbeat is also how Temporal delivers a cancellation to a running
// activity. The first one waits for the first interval: the SDK sends a
// first heartbeat at once, synchronously, and the server persists it, so
// one at the start cost every attempt a round trip and a write on its
// critical path (stop waits for it) while saying nothing the defaults do
// not (no content, no connection yet). An answer within the interval
// needs none (issue 15, docs/performance.md).
//
// A streamed attempt's heartbeats carry its worker's stream URL, when the
// worker advertises one; a caller in another process finds the stream
// sooner in the worker's identity (attempt.StreamIdentity), which Temporal
// records when the attempt starts.
func (a *Activities) heartbeat(ctx context.Context, att *recovery.Attempt, stream bool) (stop func()) {
	if !activity.IsActivity(ctx) {
		return func() {}
	}
	every := a.HeartbeatEvery
	if every <= 0 {
		every = 250 * time.Millisecond
	}
	var url string
	if stream {
		url = a.StreamURL
	}
	return onEachTick(every, ctx.Done(), func() {
		ev := att.Evidence()
		stage := "sending"
		if ev.ContentStarted {
			stage = "streaming"
		}
		activity.RecordHeartbeat(ctx, attempt.Progress{AttemptID: att.ID(), Stage: stage, ConnRef: ev.ConnRef, ContentStarted: ev.ContentStarted, ResponseBytes: ev.ResponseBytes, StreamURL: url})
	})
}

// DescribeRoutes returns the Plan for the named routes. The workflow runs
// it as a local activity so route configuration stays on the worker and
// the answer is recorded in history.
func (a *Activities) DescribeRoutes(_ context.Context, in attempt.PlanInput) (attempt.Plan, error) {
	p := attempt.Plan{Reconciler: a.Reconciler != nil || a.Journal != nil, SearchAttributes: a.SearchAttributes, StateUpserts: attempt.CurrentStateUpserts, DeadlineTimer: attempt.CurrentDeadlineTimer}
	for _, name := range in.Routes {
		r, ok := a.Routes[name]
		if !ok {
			p.Unknown = append(p.Unknown, name)
			continue
		}
		p.Routes = append(p.Routes, attempt.RouteInfo{
			Name: r.Name, Kind: r.Kind, Model: r.Model, Capabilities: r.Capabilities,
			HonoursIdempotencyKey: r.HonoursIdempotencyKey, IdempotencyWindow: r.IdempotencyWindow,
			AttemptTimeout: r.AttemptTimeout,
		})
	}
	return p, nil
}

// The reconciler-facing types, under the names a Reconciler has always
// used; they are package attempt's.
type (
	// ReconcileInput describes the ambiguous attempt to the reconciler.
	ReconcileInput = attempt.ReconcileInput
	// ReconcileOutput is the reconciler's answer.
	ReconcileOutput = attempt.ReconcileOutput
	// Verdict is a reconciliation decision.
	Verdict = attempt.Verdict
)

// The verdicts, as in package attempt.
const (
	VerdictNone        = attempt.VerdictNone
	VerdictCompleted   = attempt.VerdictCompleted
	VerdictNotExecuted = attempt.VerdictNotExecuted
	VerdictAllowReplay = attempt.VerdictAllowReplay
	VerdictAbandon     = attempt.VerdictAbandon
)

// ErrNoReconciler is returned by Reconcile when none is configured.
var ErrNoReconciler = errors.New("durallm: no reconciler configured on this worker")

// Reconcile asks the configured Reconciler about an ambiguous attempt.
//
// The journal comes first (docs/contract.md section 5.5):
//   - a response a worker received and journaled settles the attempt as
//     completed, by the journal;
//   - an exchange the engine proved unsent settles it as not executed;
//   - a request journaled as sent, with no end yet, may still end on a
//     live worker (Temporal lost track of it, the worker did not): the
//     reconciler waits for that end until the attempt's own deadline;
//   - otherwise the journal cannot tell.
//
// An unreadable journal is logged and passed over. Then the application's
// Reconciler, if any.
func (a *Activities) Reconcile(ctx context.Context, in attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
	var fromJournal attempt.ReconcileOutput
	if a.Journal != nil {
		out, settled := a.reconcileFromJournal(ctx, in)
		if settled {
			return out, nil
		}
		fromJournal = out
	}
	if a.Reconciler == nil {
		if a.Journal != nil {
			fromJournal.Verdict, fromJournal.By = attempt.VerdictNone, attempt.ByJournal
			return fromJournal, nil
		}
		return attempt.ReconcileOutput{}, ErrNoReconciler
	}
	out, err := a.Reconciler.Reconcile(ctx, in)
	if err != nil {
		return attempt.ReconcileOutput{}, fmt.Errorf("durallm: reconciler for %s attempt %d: %w", in.ActionRef, in.Attempt, err)
	}
	out.By, out.JournalState = attempt.ByReconciler, fromJournal.JournalState
	return out, nil
}

// journalPoll is how often the built-in reconciler looks again at an
// attempt that may still end on a live worker; journalEndGrace is how long
// past the attempt's deadline it waits for the end record the worker
// writes right after the exchange ends.
// A Sent entry unrenewed for three leases (journalLease) counts as its
// worker's loss.
const (
	journalPoll     = 250 * time.Millisecond
	journalEndGrace = 3 * time.Second
)

func (a *Activities) journalLease() time.Duration {
	if a.lease > 0 {
		return a.lease
	}
	return journalLease
}

// reconcileFromJournal is the built-in reconciler. Unsettled, out says
// in its Note and JournalState what the journal knew.
func (a *Activities) reconcileFromJournal(ctx context.Context, in attempt.ReconcileInput) (out attempt.ReconcileOutput, settled bool) {
	unsettled := func(state, note string) (attempt.ReconcileOutput, bool) {
		return attempt.ReconcileOutput{JournalState: state, Note: note}, false
	}
	e, ok, err := a.Journal.Lookup(ctx, in.AttemptID)
	// A Sent entry's worker renews it while the exchange runs: the wait
	// goes on while it does, measured on this worker's clock (a renewal
	// is a change of At, whatever the writer's clock says).
	renewed, lastAt := time.Now(), e.At
	for err == nil && ok && e.State == journal.Sent && a.mayStillEnd(ctx, e) && time.Since(renewed) < 3*a.journalLease() {
		if activity.IsActivity(ctx) {
			activity.RecordHeartbeat(ctx, "waiting for attempt "+in.AttemptID+" to end on its worker")
		}
		select {
		case <-ctx.Done():
			return unsettled(string(e.State), "the wait for the attempt's end was cut short: "+ctx.Err().Error())
		case <-time.After(journalPoll):
		}
		e, ok, err = a.Journal.Lookup(ctx, in.AttemptID)
		if !e.At.Equal(lastAt) {
			renewed, lastAt = time.Now(), e.At
		}
	}
	switch {
	case err != nil:
		a.logger().Warn("attempt journal unavailable: the built-in reconciler cannot tell", "attempt_id", in.AttemptID, "error", err)
		a.Telemetry.JournalFailed(ctx)
		return unsettled("unreadable", "the journal could not be read")
	case !ok:
		return unsettled("none", "the journal holds no entry for this attempt")
	}
	at := e.At.UTC().Format(time.RFC3339Nano)
	switch e.State {
	case journal.Received:
		if e.Response == nil {
			return unsettled(string(e.State), "the journal's received entry holds no response")
		}
		out = attempt.ReconcileOutput{Verdict: attempt.VerdictCompleted, Response: e.Response, By: attempt.ByJournal, JournalState: string(e.State),
			Note: "a worker received the response at " + at + " and journaled it before its report was lost"}
		a.storeLargeVerdict(ctx, &out)
		return out, true
	case journal.NotProcessed:
		return attempt.ReconcileOutput{Verdict: attempt.VerdictNotExecuted, By: attempt.ByJournal, JournalState: string(e.State),
			Note: "the worker proved at " + at + " that the provider did not process the request (" + string(e.Class) + ": " + e.Reason + ")"}, true
	case journal.Sent:
		return unsettled(string(e.State), "the request left and its worker stopped renewing the entry (last at "+at+") with no end journaled: it was lost mid-request")
	default:
		return unsettled(string(e.State), "the exchange ended unanswered at "+at+" ("+e.Reason+"): no proof either way")
	}
}

// mayStillEnd reports whether a Sent attempt may still end on a live
// worker: its deadline, and the grace for the end record, have not passed,
// and this activity has time left to wait.
func (a *Activities) mayStillEnd(ctx context.Context, e journal.Entry) bool {
	if e.Deadline.IsZero() {
		return false
	}
	until := e.Deadline.Add(journalEndGrace)
	if d, ok := ctx.Deadline(); ok && d.Add(-time.Second).Before(until) {
		until = d.Add(-time.Second)
	}
	return time.Now().Before(until)
}

// storeLargeVerdict keeps a journaled response too large for history in
// the result store, as storeLarge does for an attempt's.
func (a *Activities) storeLargeVerdict(ctx context.Context, out *attempt.ReconcileOutput) {
	o := attempt.Outcome{Response: out.Response}
	a.storeLarge(ctx, &o)
	out.Response, out.ResultRef = o.Response, o.ResponseRef
}
