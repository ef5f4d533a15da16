// Package activities adapts the recovery engine and the provider layer to
// Temporal: one CallModel execution is one attempt (docs/contract.md section 1).
//
// CallModel returns the attempt's classified outcome as data. The only
// error it returns is a cancellation when the action's own scope ended: it
// wraps ctx.Err() with %w, and a temporal.CanceledError whose details are
// the outcome, so Temporal records a cancellation rather than a failure
// and the timeline keeps the attempt's evidence. A worker shutdown, an
// activity pause, or Temporal losing track of an attempt not yet sent is
// not the action's scope: the attempt's outcome (a committed partial, an
// ambiguous or unsent attempt) is returned as data.
// Temporal must never retry it: the workflow schedules it with
// RetryPolicy.MaximumAttempts = 1 and owns the only budget.
package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"

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
		Intermediary: route.Intermediary, HonoursIdempotencyKey: route.HonoursIdempotencyKey, DeferEvent: true,
		// The provider layer commits when content reaches the caller: for
		// a stream, the first content delta; for JSON, a usable body.
		ManualCommit: true,
	})
	if !known {
		// A route the workflow names but this worker does not know cannot
		// serve the action; another route may.
		ev, class := att.FinishWith(evidence.Facts{Unsendable: evidence.UnsendableNoRoute})
		return a.finish(ctx, in, route, attempt.Outcome{Evidence: ev, Classification: class}, providers.Usage{}, nil)
	}

	// One rule for the attempt's timeout (docs/workflow.md): the action's
	// attempt_timeout when it sets one, else the route's, never past the
	// deadline. The workflow has applied it; the exchange's own timer is
	// set from it, so a route default cannot cut a longer attempt short.
	if in.Timeout > 0 {
		route.AttemptTimeout = in.Timeout
	}

	// Heartbeats go on the activity's context: they end when Temporal
	// has lost the attempt, while an exchange already on the wire runs
	// on, and with it the journal's sent record (one not yet sent ends
	// there). The worker's own stop ends the exchange after StopGrace
	// either way, lost or not.
	stop := a.heartbeat(ctx, att)
	ctx, detach := a.outliveLostAttempt(ctx, in, att.OnTheWire)
	defer detach()
	ctx, release := a.endOnWorkerStop(ctx)
	defer release()
	sent := a.journalSent(ctx, in, att)
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
	sent.stop() // no renewal starts once the exchange has ended
	ev, class := att.FinishWith(facts(ctx, res, err))
	out := attempt.Outcome{Evidence: ev, Classification: class}
	switch class.Class {
	case evidence.Completed, evidence.CommittedPartial:
		r := res.Response
		out.Response = &r
	}
	return a.finish(ctx, in, route, out, res.Response.Usage, sent)
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

// ErrTemporalLost is the cause an attempt's exchange is canceled with when
// Temporal lost track of the attempt before its request was on the wire.
var ErrTemporalLost = errors.New("durallm: Temporal lost track of the attempt before its request left")

// outliveLostAttempt returns the context the exchange runs on. It ends
// when the activity's context does, with its cause, except when Temporal
// lost track of the attempt: the SDK cancels an activity whose heartbeat
// finds it gone (serviceerror.NotFound: it timed out on the server) or
// cannot reach the server for the heartbeat timeout (a server restart).
//
// Once the request is on the wire (onTheWire), nobody asked the attempt
// to stop, and cutting it would throw away an answer the provider is
// sending: the exchange runs on to its own deadline, its end goes to the
// journal before the (probably refused) report, and the built-in
// reconciler settles the action from there (docs/contract.md section
// 5.5). Before that, the exchange ends at once with ErrTemporalLost: the
// workflow already counts the attempt lost and may send the next one, so
// this one must never leave. It is then unsent by the engine's own proof
// and journaled not_processed, which is true.
//
// The causes that do stop the exchange are the ones that mean it:
// the workflow's cancellation (a temporal.CanceledError), the worker
// stopping, an operator's pause or reset, and a context ended without a
// cause (nothing tells it apart from a cancellation).
func (a *Activities) outliveLostAttempt(ctx context.Context, in attempt.Input, onTheWire func() bool) (context.Context, func()) {
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
		// The check and the cut are not one step: HEADERS that leave
		// between them are seen by the engine's proof of non-sending
		// (docs/contract.md section 3.4), so that attempt is ambiguous
		// (temporal_lost_mid_attempt), never sent twice unseen.
		if !onTheWire() {
			a.logger().Warn("Temporal lost track of the attempt before its request left; the attempt ends unsent",
				"action_ref", in.ActionRef, "attempt", in.Attempt, "attempt_id", in.AttemptID, "cause", cause)
			cancel(fmt.Errorf("%w: %w", ErrTemporalLost, cause))
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
func facts(ctx context.Context, res exchange.Result, err error) evidence.Facts {
	f := evidence.Facts{Signal: res.Signal, Stop: stopCause(ctx)}
	switch {
	case errors.Is(err, exchange.ErrUnsupported), errors.Is(err, exchange.ErrUnknownKind):
		f.Unsendable = evidence.UnsendableRoute
	case errors.Is(err, providers.ErrInvalidRequest):
		f.Unsendable = evidence.UnsendableInvalid
	}
	switch {
	case f.Signal != evidence.SignalNone:
	case res.Response.Partial:
		// The wire ended cleanly but the stream was cut: the provider
		// layer knows, the engine cannot.
		f.Signal = evidence.SignalStreamIncomplete
	case err != nil:
		// The adapter failed without saying why: whatever the wire says,
		// the body was not usable (for a clean 2xx, an executed request
		// with no answer).
		f.Signal = evidence.SignalEmptyResponse
	}
	return f
}

// stopCause says why the activity's context ended, from its cause: our
// own ErrTemporalLost when Temporal lost the attempt before it was sent,
// our own ErrWorkerStopping, or the Temporal SDK's worker.ErrWorkerShutdown
// when the worker stops, activity.ErrActivityPaused or ErrActivityReset
// when an operator intervenes, and a canceled error when the workflow
// asked.
func stopCause(ctx context.Context) evidence.StopCause {
	if ctx.Err() == nil {
		return ""
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrTemporalLost):
		return evidence.StopTemporalLost
	case errors.Is(cause, ErrWorkerStopping), errors.Is(cause, worker.ErrWorkerShutdown):
		return evidence.StopWorkerShutdown
	case errors.Is(cause, activity.ErrActivityPaused), errors.Is(cause, activity.ErrActivityReset):
		return evidence.StopPaused
	default:
		return evidence.StopScope
	}
}

// finish records the attempt's metrics, keeps a large response out of
// history, and returns the outcome. A canceled attempt returns an error
// that Temporal records as a cancellation (it wraps ctx.Err() and a
// temporal.CanceledError) carrying the outcome as its details, so the
// workflow's timeline keeps the connection, the stream and whether content
// had been delivered.
func (a *Activities) finish(ctx context.Context, in attempt.Input, route routes.Route, out attempt.Outcome, usage providers.Usage, sent *sentRecord) (attempt.Outcome, error) {
	a.Telemetry.RecordAttempt(ctx, telemetry.Attempt{
		Route: in.Route, Provider: route.Kind, Model: route.Model, Evidence: out.Evidence, Class: out.Classification,
		InputTokens: usage.PromptTokens, OutputTokens: usage.CompletionTokens,
	})
	// One bound for the end record and the renewals still in flight; the
	// result store gets its own after it, inside the same deadline.
	by := writeBy(ctx, journalWriteTimeout)
	if out.Classification.Class == evidence.Canceled && ctx.Err() != nil {
		sent.wait(by)
		return out, fmt.Errorf("durallm: attempt %d of %s canceled: %w (%w)", in.Attempt, in.ActionRef, ctx.Err(), temporal.NewCanceledError(out))
	}
	a.record(ctx, in, out, by)
	sent.wait(by)
	if a.BeforeReport != nil {
		a.BeforeReport(out)
	}
	a.storeLarge(ctx, &out)
	return out, nil
}

// How long a write the report waits for may take: the end record (and
// the renewals in flight), then the result store's Put. Neither backend
// bounds a write by itself, and an answer held past the activity's
// deadline is lost to Temporal (which then asks a person), so each is cut
// there, and never later than reportReserve before the deadline.
const (
	journalWriteTimeout = time.Second
	resultWriteTimeout  = 5 * time.Second
	reportReserve       = 500 * time.Millisecond
)

// ErrWriteTimedOut is returned (wrapped, with the context's error) for a
// journal or result-store write that did not finish within its bound.
// The write may still land later.
var ErrWriteTimedOut = errors.New("durallm: the write did not finish in time")

// writeBy is when a write started now must be done: d from now, and
// never later than reportReserve before ctx's deadline.
func writeBy(ctx context.Context, d time.Duration) time.Time {
	by := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-reportReserve).Before(by) {
		by = dl.Add(-reportReserve)
	}
	return by
}

// boundedWrite runs write on a goroutine of its own, with a context that
// ends at by (and not with ctx: a worker stop must not cut the record of
// what it saw), and stops waiting for it then: Dir's fsync ignores its
// context, and a half-open connection may outlast it. The write is left
// to finish or fail by itself; the backends keep a late Sent from hiding
// an end (journal.Journal.Record).
func boundedWrite(ctx context.Context, by time.Time, write func(context.Context) error) error {
	wctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), by)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- write(wctx) }()
	select {
	case err := <-done:
		return err
	case <-wctx.Done():
		return fmt.Errorf("%w: %w", ErrWriteTimedOut, wctx.Err())
	}
}

// record journals how the attempt ended, before it is reported: the
// response a worker received survives the report being lost. A journal
// that cannot be written by by is logged and counted, never an attempt's
// failure: the outcome still goes to Temporal.
func (a *Activities) record(ctx context.Context, in attempt.Input, out attempt.Outcome, by time.Time) {
	if a.Journal == nil {
		return
	}
	e := journal.Entry{AttemptID: in.AttemptID, ActionRef: in.ActionRef, Attempt: in.Attempt,
		Class: out.Classification.Class, Reason: out.Classification.Reason, At: time.Now()}
	switch {
	case out.Response != nil:
		e.State, e.Response = journal.Received, out.Response
	case out.Classification.Class == evidence.Unsent, out.Classification.Class == evidence.Refused:
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
	if err := boundedWrite(ctx, by, func(ctx context.Context) error { return a.Journal.Record(ctx, e) }); err != nil {
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

// sentInFlight bounds an attempt's renewal writes that have not returned
// (waited for or abandoned): a hung journal holds that many goroutines per
// attempt, not one per lease.
const sentInFlight = 3

// sentRecord is an attempt's Sent record in the journal while its
// exchange runs. A nil sentRecord (no journal) does nothing.
type sentRecord struct {
	stopTicks func()
	// writes counts the renewal writes that have not returned, inFlight
	// the same for reading without waiting.
	writes   sync.WaitGroup
	inFlight atomic.Int32
	failed   atomic.Bool
}

// stop ends the renewals: none starts once it returns.
func (s *sentRecord) stop() {
	if s != nil {
		s.stopTicks()
	}
}

// wait waits for the renewals still in flight to return, until by at the
// latest. Correctness needs no wait (a Sent landing after the end never
// hides it); a journal that is merely slow gets its last renewal in.
func (s *sentRecord) wait(by time.Time) {
	if s == nil || s.inFlight.Load() == 0 {
		return
	}
	done := make(chan struct{})
	go func() {
		s.writes.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// journalSent journals the attempt as Sent once its request is on the
// wire, and renews the entry every journalLease while the exchange runs,
// with the time left to the exchange's deadline. A renewal never waits
// for the one before it: each is a write of its own, bounded by three
// leases (the reader's patience), so one stuck write does not make a
// live worker look dead. Failures are logged and counted like record's,
// once.
func (a *Activities) journalSent(ctx context.Context, in attempt.Input, att *recovery.Attempt) *sentRecord {
	if a.Journal == nil {
		return nil
	}
	deadline, _ := ctx.Deadline()
	var last time.Time
	s := &sentRecord{}
	// Not stopped by ctx: the caller's stop ends it, after the exchange.
	s.stopTicks = onEachTick(journalSentPoll, nil, func() {
		if time.Since(last) < a.journalLease() || s.inFlight.Load() >= sentInFlight || !att.OnTheWire() {
			return
		}
		last = time.Now()
		e := journal.Entry{AttemptID: in.AttemptID, ActionRef: in.ActionRef, Attempt: in.Attempt, State: journal.Sent, At: last, Deadline: deadline}
		if !deadline.IsZero() {
			e.Remaining = deadline.Sub(last)
		}
		by := last.Add(3 * a.journalLease())
		if !deadline.IsZero() && deadline.Before(by) {
			by = deadline
		}
		s.inFlight.Add(1)
		s.writes.Add(1)
		go func() {
			err := boundedWrite(ctx, by, func(ctx context.Context) error {
				defer s.writes.Done()
				defer s.inFlight.Add(-1)
				return a.Journal.Record(ctx, e)
			})
			if err != nil && !s.failed.Swap(true) {
				a.logger().Warn("attempt journal unavailable: the attempt goes on without its sent record", "attempt_id", in.AttemptID, "error", err)
				a.Telemetry.JournalFailed(ctx)
			}
		}()
	})
	return s
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
	var ref string
	err = boundedWrite(ctx, writeBy(ctx, resultWriteTimeout), func(ctx context.Context) error {
		var err error
		ref, err = a.Results.Put(ctx, b)
		return err
	})
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
func (a *Activities) heartbeat(ctx context.Context, att *recovery.Attempt) (stop func()) {
	if !activity.IsActivity(ctx) {
		return func() {}
	}
	every := a.HeartbeatEvery
	if every <= 0 {
		every = 250 * time.Millisecond
	}
	return onEachTick(every, ctx.Done(), func() {
		ev := att.Evidence()
		stage := "sending"
		if ev.ContentStarted {
			stage = "streaming"
		}
		activity.RecordHeartbeat(ctx, attempt.Progress{AttemptID: att.ID(), Stage: stage, ConnRef: ev.ConnRef, ContentStarted: ev.ContentStarted, ResponseBytes: ev.ResponseBytes})
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
// Reconciler, if any. A Reconcile cut short (its worker stops, or it is
// canceled) returns an error wrapping ctx's error and cause: it has not
// found that nothing can tell, so Temporal retries it.
func (a *Activities) Reconcile(ctx context.Context, in attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
	var fromJournal attempt.ReconcileOutput
	if a.Journal != nil {
		out, settled, err := a.reconcileFromJournal(ctx, in)
		if err != nil {
			return attempt.ReconcileOutput{}, err
		}
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
// in its Note and JournalState what the journal knew. It fails only when
// ctx ended (cutShort).
func (a *Activities) reconcileFromJournal(ctx context.Context, in attempt.ReconcileInput) (out attempt.ReconcileOutput, settled bool, err error) {
	unsettled := func(state, note string) (attempt.ReconcileOutput, bool, error) {
		return attempt.ReconcileOutput{JournalState: state, Note: note}, false, nil
	}
	e, ok, err := a.Journal.Lookup(ctx, in.AttemptID)
	// A Sent entry's worker renews it while the exchange runs: the wait
	// goes on while it does, judged on this worker's own observation of
	// the entry (sentWait), whatever the writer's clock says.
	var w sentWait
	var why sentWaitEnd
	for err == nil && ok && e.State == journal.Sent {
		w.see(e, time.Now())
		if why = a.whyNotWait(ctx, w, time.Now()); why != "" {
			break
		}
		if activity.IsActivity(ctx) {
			activity.RecordHeartbeat(ctx, "waiting for attempt "+in.AttemptID+" to end on its worker")
		}
		select {
		case <-ctx.Done():
			return attempt.ReconcileOutput{}, false, cutShort(ctx, in)
		case <-time.After(journalPoll):
		}
		e, ok, err = a.Journal.Lookup(ctx, in.AttemptID)
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// A read that failed because the wait was cut short proves
		// nothing about the journal.
		return attempt.ReconcileOutput{}, false, cutShort(ctx, in)
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
		return out, true, nil
	case journal.NotProcessed:
		return attempt.ReconcileOutput{Verdict: attempt.VerdictNotExecuted, By: attempt.ByJournal, JournalState: string(e.State),
			Note: "the worker proved at " + at + " that the provider did not process the request (" + string(e.Class) + ": " + e.Reason + ")"}, true, nil
	case journal.Sent:
		switch {
		case why == sentStoppedRenewing:
			return unsettled(string(e.State), "the request left and its worker stopped renewing the entry (last written at "+at+") with no end journaled: it was lost mid-request")
		case why == sentOutOfTime && w.renewals > 0:
			return unsettled(string(e.State), "the request left and its worker still renews the entry (last written at "+at+"), but the attempt had not ended when this reconciler's own time ran out")
		case why == sentOutOfTime:
			return unsettled(string(e.State), "the request left and no end was journaled (the entry was last written at "+at+") when this reconciler's own time ran out")
		default:
			return unsettled(string(e.State), "the request left and the attempt's deadline passed with no end journaled (the entry was last written at "+at+")")
		}
	default:
		return unsettled(string(e.State), "the exchange ended unanswered at "+at+" ("+e.Reason+"): no proof either way")
	}
}

// cutShort is the error of a reconciler whose context ended before it
// could decide: it wraps ctx's error (so a cancellation is recorded as
// one) and its cause (a worker shutdown, say).
func cutShort(ctx context.Context, in attempt.ReconcileInput) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return fmt.Errorf("durallm: reconciling %s attempt %d was cut short: %w", in.ActionRef, in.Attempt, err)
	}
	return fmt.Errorf("durallm: reconciling %s attempt %d was cut short: %w (%w)", in.ActionRef, in.Attempt, err, cause)
}

// sentWait is what the built-in reconciler has seen of a Sent entry, on
// its own clock: the writer's clock never meets the reader's
// (docs/contract.md section 5.5).
type sentWait struct {
	last journal.Entry
	// changed is when this reader last saw the entry change (a renewal);
	// until is when, by this reader's clock, the attempt's worker gives up
	// on it: the time the entry said remained, from when it was seen.
	changed, until time.Time
	// renewals counts the changes seen after the first look.
	renewals int
}

func (w *sentWait) see(e journal.Entry, now time.Time) {
	switch {
	case w.changed.IsZero():
	case e.At.Equal(w.last.At) && e.Remaining == w.last.Remaining:
		return
	default:
		w.renewals++
	}
	w.last, w.changed, w.until = e, now, now.Add(remaining(e))
}

// remaining is how long the entry's worker still gave its attempt when it
// wrote the entry. An entry from before Remaining says it as its Deadline
// minus its At, both on the writer's clock.
func remaining(e journal.Entry) time.Duration {
	switch {
	case e.Remaining != 0:
		return e.Remaining
	case !e.Deadline.IsZero() && !e.At.IsZero():
		return e.Deadline.Sub(e.At)
	}
	return 0
}

// sentWaitEnd says why the built-in reconciler stopped waiting for a Sent
// attempt to end.
type sentWaitEnd string

const (
	// sentPastDeadline: the attempt's deadline, and the grace for its end
	// record, passed.
	sentPastDeadline sentWaitEnd = "past_deadline"
	// sentStoppedRenewing: the entry did not change for three leases.
	sentStoppedRenewing sentWaitEnd = "stopped_renewing"
	// sentOutOfTime: this reconcile activity's own deadline is near.
	sentOutOfTime sentWaitEnd = "out_of_time"
)

// whyNotWait says why a Sent attempt can no longer end on a live worker
// as far as this reconciler can wait, or "" while it may.
func (a *Activities) whyNotWait(ctx context.Context, w sentWait, now time.Time) sentWaitEnd {
	switch {
	case !now.Before(w.until.Add(journalEndGrace)):
		return sentPastDeadline
	case now.Sub(w.changed) >= 3*a.journalLease():
		return sentStoppedRenewing
	}
	if d, ok := ctx.Deadline(); ok && !now.Before(d.Add(-time.Second)) {
		return sentOutOfTime
	}
	return ""
}

// storeLargeVerdict keeps a journaled response too large for history in
// the result store, as storeLarge does for an attempt's.
func (a *Activities) storeLargeVerdict(ctx context.Context, out *attempt.ReconcileOutput) {
	o := attempt.Outcome{Response: out.Response}
	a.storeLarge(ctx, &o)
	out.Response, out.ResultRef = o.Response, o.ResponseRef
}
