package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/telemetry"
)

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
	stop := a.heartbeat(ctx, att, in.Request.Stream)
	ctx, detach := a.outliveLostAttempt(ctx, in, att.OnTheWire)
	defer detach()
	ctx, release := a.endOnWorkerStop(ctx)
	defer release()
	sent := a.journalSent(ctx, in, att)
	var sink exchange.Sink
	var pieces *providers.Pieces
	if a.Streams != nil {
		as := a.Streams.forAttempt(in.ActionRef, in.Attempt)
		sink, pieces = as, &as.pieces
	}
	engine := a.Engine
	if route.InsecureSkipVerify && a.InsecureEngine != nil {
		engine = a.InsecureEngine
	}
	res, err := exchange.CallRoute(recovery.WithAttempt(ctx, att), engine, exchange.Call{Route: route, Request: in.Request, Sink: sink,
		Record: exchange.RecordIDs{AttemptID: in.AttemptID, ActionRef: in.ActionRef}})
	stop()
	sent.stop() // no renewal starts once the exchange has ended
	ev, class := att.FinishWith(facts(ctx, res, err))
	if a.Streams != nil {
		a.Streams.attemptEnded(in.ActionRef, class.Class)
	}
	if pieces != nil {
		// How the answer streamed, so that any reader numbers it alike.
		res.Response.Pieces = *pieces
	}
	out := attempt.Outcome{Evidence: ev, Classification: class}
	switch class.Class {
	case evidence.Completed, evidence.CommittedPartial:
		r := res.Response
		out.Response = &r
	case evidence.Rejected, evidence.ContentFiltered:
		// The provider's error object is the caller's answer (a gateway
		// passes it back); its message may quote the prompt, so it stays
		// in the response it belongs to (docs/contract.md section 7).
		if res.Response.Error != nil {
			out.Response = &providers.Response{Error: res.Response.Error}
		}
	case evidence.Canceled:
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
	return a.finish(ctx, in, route, out, res.Response.Usage, sent)
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
	if usage.Reported() {
		// Whatever the class, and also when the response itself goes
		// to the result store: the workflow charges the attempt with it.
		u := usage
		out.Usage = &u
	}
	spend := telemetry.Attempt{
		Route: in.Route, Provider: route.Kind, Model: route.Model, Evidence: out.Evidence, Class: out.Classification,
		InputTokens: usage.PromptTokens, OutputTokens: usage.CompletionTokens,
		CachedInputTokens: usage.CachedTokens, CacheWriteInputTokens: usage.CacheWriteTokens, Caller: in.Caller,
	}
	if route.Prices != nil {
		spend.Cost, spend.Priced = route.Prices.Cost(usage), true
	}
	a.Telemetry.RecordAttempt(ctx, spend)
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
	a.storeLarge(ctx, in.ActionRef, &out)
	return out, nil
}

// heartbeat records progress every HeartbeatEvery until stop is called.
// The heartbeat is also how Temporal delivers a cancellation to a running
// activity. The first one waits for the first interval: the SDK sends a
// first heartbeat at once, synchronously, and the server persists it, so
// one at the start cost every attempt a round trip and a write on its
// critical path (stop waits for it) while saying nothing the defaults do
// not (no content, no connection yet). An answer within the interval
// needs none (docs/performance.md).
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
