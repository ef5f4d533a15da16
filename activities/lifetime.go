package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/attempt"
)

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
