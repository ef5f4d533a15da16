package actiontest

import (
	"context"
	"errors"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/durallm/durallm/workflows"
)

// record is what the actions know of one started action: its run, its
// status as it last saw it, its end once it ended, and the AwaitCall
// activities waiting for it to move.
type record struct {
	runID   string
	status  workflows.Status
	ended   bool
	res     workflows.ActionResult
	err     error
	waiters []waiter
}

// waiter is an AwaitCall left pending until the action moves from where
// it knew it.
type waiter struct {
	q     workflows.CallQuery
	token []byte
}

// started notes that action id's run began.
func (a *Actions) started(id, runID string) {
	a.mu.Lock()
	a.records[id] = &record{runID: runID}
	a.mu.Unlock()
}

// observed notes action id's status, from its own workflow code
// (Interceptor) before each wait, and completes each AwaitCall it moved
// for.
func (a *Actions) observed(id string, st workflows.Status) {
	a.mu.Lock()
	if r := a.records[id]; r != nil {
		r.status = st
	}
	a.mu.Unlock()
	a.wake(id)
}

// finished notes action id's end, and completes every AwaitCall waiting
// for it.
func (a *Actions) finished(id string, res workflows.ActionResult, err error) {
	a.mu.Lock()
	if r := a.records[id]; r != nil {
		r.ended, r.res, r.err = true, res, err
	}
	a.mu.Unlock()
	a.wake(id)
}

// wake completes the AwaitCall activities for action id whose action has
// moved, as a worker's returns once it sees the move.
func (a *Actions) wake(id string) {
	type done struct {
		token []byte
		pos   workflows.CallPosition
		err   error
	}
	var moved []done
	a.mu.Lock()
	if r := a.records[id]; r != nil {
		still := r.waiters[:0]
		for _, w := range r.waiters {
			pos, err := a.positionLocked(w.q)
			switch {
			case err == nil && !pos.Found:
				moved = append(moved, done{w.token, workflows.CallPosition{}, notFound(id)})
			case err != nil:
				moved = append(moved, done{w.token, workflows.CallPosition{}, err})
			case hasMoved(w.q, pos):
				moved = append(moved, done{w.token, pos, nil})
			default:
				still = append(still, w)
			}
		}
		r.waiters = still
	}
	a.mu.Unlock()
	for _, d := range moved {
		// A wait canceled meanwhile has no activity left to complete:
		// the environment ignores it.
		_ = a.env.CompleteActivity(d.token, d.pos, d.err)
	}
}

// describeCall is workflows.DescribeCall in the test environment: where
// the action stands, from what the actions saw of it (started, ended,
// awaiting a verdict), as a worker's worker.Calls reads it from Temporal.
// It is how a call of a name made before (the same name twice, a later
// run) and step.Attach reach an existing action in a unit test.
func (a *Actions) describeCall(_ context.Context, q workflows.CallQuery) (workflows.CallPosition, error) {
	return a.position(q)
}

// awaitCall is workflows.AwaitCall in the test environment: it returns
// once the action stands elsewhere than q.Known (ended, or with
// q.Awaiting its wait for a verdict began, moved or ended). The SDK's
// test environment stops its clock while an activity runs, so it cannot
// wait inside the activity as a worker's does: it leaves its result
// pending, and the action completes it when it moves (wake), in virtual
// time.
func (a *Actions) awaitCall(ctx context.Context, q workflows.CallQuery) (workflows.CallPosition, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pos, err := a.positionLocked(q)
	switch {
	case err != nil:
		return pos, err
	case !pos.Found:
		return pos, notFound(q.ActionRef)
	case hasMoved(q, pos):
		return pos, nil
	}
	r := a.records[q.ActionRef]
	r.waiters = append(r.waiters, waiter{q: q, token: activity.GetInfo(ctx).TaskToken})
	return pos, activity.ErrResultPending
}

func notFound(id string) error {
	return temporal.NewNonRetryableApplicationError("action "+id+" not found", workflows.CallNotFoundType, nil)
}

// hasMoved reports whether pos is somewhere AwaitCall(q) returns.
func hasMoved(q workflows.CallQuery, pos workflows.CallPosition) bool {
	return !pos.Found || pos.Ended || q.Awaiting && (pos.Awaiting != q.Known.Awaiting || pos.Attempt != q.Known.Attempt)
}

// position is where action q.ActionRef stands now.
func (a *Actions) position(q workflows.CallQuery) (workflows.CallPosition, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.positionLocked(q)
}

// positionLocked is position with a.mu held.
func (a *Actions) positionLocked(q workflows.CallQuery) (workflows.CallPosition, error) {
	r, c := a.records[q.ActionRef], a.calls[q.ActionRef]
	var pos workflows.CallPosition
	if r == nil || (q.RunID != "" && q.RunID != r.runID) {
		return pos, nil
	}
	rec := r
	pos.Found, pos.RunID = true, rec.runID
	if q.Chain != "" {
		// Another workflow than the caller's run chain, or none, started
		// it (worker.Calls tells them apart the same way).
		pos.OtherChain = c == nil || c.parentID != q.ParentID || c.chain != q.Chain
	}
	if rec.ended {
		var app *temporal.ApplicationError
		if errors.As(rec.err, &app) && app.Type() == workflows.InvalidInputType {
			return pos, temporal.NewNonRetryableApplicationError(app.Message(), workflows.InvalidInputType, nil)
		}
		if rec.err != nil {
			return pos, temporal.NewNonRetryableApplicationError("action "+q.ActionRef+" closed without a result", workflows.CallClosedType, nil)
		}
		res := rec.res
		pos.Ended, pos.Result = true, &res
		return pos, nil
	}
	if st := rec.status; q.Awaiting && st.State == workflows.StateAwaitingReconciliation {
		pos.Awaiting, pos.Attempt, pos.Since = true, st.AwaitingAttempt, st.AwaitingSince
	}
	return pos, nil
}
