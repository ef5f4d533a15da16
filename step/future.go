package step

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/workflows"
)

// Future is a call started by StartCall, or an action reached by Attach.
// Use it from the workflow that made it only.
//
// A coroutine of its own follows the action from the start: its end, and
// with ReturnIfAwaiting its waits for a verdict, so that Get, IsReady and
// Ready answer from where the action stands now, whenever the workflow
// asks.
type Future struct {
	id    string
	o     options
	ctx   workflow.Context // the caller's: its cancellation cancels a call
	dctx  workflow.Context // disconnected: the Future's own waits
	owner bool             // a call (StartCall), not a watch (Attach)

	started    workflow.Future
	setStarted workflow.Settable
	isStarted  bool

	ended bool
	res   workflows.ActionResult
	err   error

	// With ReturnIfAwaiting: the action's signals; while it awaits a
	// verdict, on which attempt and since when, whether the caller's
	// patience for it is spent, and the timer that spends it.
	notices     workflow.ReceiveChannel
	awaiting    bool
	attempt     int
	since       time.Time
	spent       bool
	timer       workflow.Future
	cancelTimer workflow.CancelFunc
	// left: the call has awaited its verdict for the caller's patience,
	// and is left to it; canceling the caller no longer cancels it.
	left       bool
	cancelSent bool

	readies []workflow.Settable
}

func newFuture(ctx workflow.Context, id string, o options, owner bool) *Future {
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	f := &Future{id: id, o: o, ctx: ctx, dctx: dctx, owner: owner}
	f.started, f.setStarted = workflow.NewFuture(dctx)
	return f
}

// ActionID is the action's id (see the package function ActionID). For
// a new workflow under the id of a closed one whose call of the same
// name Temporal still keeps, it changes once, before Started is ready.
func (f *Future) ActionID() string { return f.id }

// Started is ready once the action runs: the child started, or the
// action this call or Attach reached was found. Its Get fills a
// *workflow.Execution (the action's id and run id), or returns the error
// Get returns when the action could not start or be found.
func (f *Future) Started() workflow.Future { return f.started }

// IsReady reports whether Get returns without blocking: the action has
// ended (or could not start), or with ReturnIfAwaiting it has awaited a
// verdict on one attempt for the option's duration.
func (f *Future) IsReady() bool {
	return f.ended || (f.o.awaitFor > 0 && f.awaiting && f.spent)
}

// Ended reports whether the action has ended (or could not start): Get
// returns its end without blocking. After an early return
// (ReturnIfAwaiting), workflow.Await(ctx, f.Ended) waits for the end.
func (f *Future) Ended() bool { return f.ended }

// Ready returns a workflow.Future that becomes ready when IsReady does,
// for a workflow.Selector (which takes only the SDK's own futures, so
// the Future itself cannot be one):
//
//	sel.AddFuture(f.Ready(), func(r workflow.Future) { err = r.Get(ctx, &res) })
//
// Its Get fills a *workflows.ActionResult and returns what Get returns
// at that moment. Each call returns a new one: after an early return
// (ReturnIfAwaiting), the next is ready at the action's end, or at once
// while it still awaits a verdict as long.
func (f *Future) Ready() workflow.Future {
	fut, set := workflow.NewFuture(f.dctx)
	if f.IsReady() {
		f.settle(set)
	} else {
		f.readies = append(f.readies, set)
	}
	return fut
}

// Get waits for the action's end and returns its result, with the errors
// described in the package doc. With ReturnIfAwaiting it returns an
// *durallm.AwaitingError instead once the action has awaited a verdict on
// one attempt for the option's duration, counted from when the wait
// began; called again while the action still awaits that attempt, it
// returns the error at once, and after the action moved on to another
// attempt awaiting a verdict, it names that one.
//
// When the caller's context is canceled, Get of a call waits for the
// action's end, which the cancellation brings; Get of a call left to its
// verdict, and of Attach, returns the cancellation.
func (f *Future) Get(ctx workflow.Context) (workflows.ActionResult, error) {
	wctx := ctx
	if f.owner && !f.left {
		wctx, _ = workflow.NewDisconnectedContext(ctx)
	}
	if err := workflow.Await(wctx, f.IsReady); err != nil {
		return workflows.ActionResult{}, err
	}
	return f.answer()
}

func (f *Future) answer() (workflows.ActionResult, error) {
	if f.ended {
		return f.res, f.err
	}
	return workflows.ActionResult{}, &durallm.AwaitingError{ActionRef: f.id, Attempt: f.attempt, Since: f.since}
}

func (f *Future) settle(set workflow.Settable) {
	res, err := f.answer()
	if err != nil {
		set.SetError(err)
		return
	}
	set.SetValue(res)
}

func (f *Future) settleReadies() {
	if !f.IsReady() {
		return
	}
	for _, s := range f.readies {
		f.settle(s)
	}
	f.readies = nil
}

func (f *Future) markStarted(we workflow.Execution, err error) {
	if f.isStarted {
		return
	}
	f.isStarted = true
	if err != nil {
		f.setStarted.SetError(err)
		return
	}
	f.setStarted.SetValue(we)
}

// end records the action's end (err as Get returns it).
func (f *Future) end(res workflows.ActionResult, err error) {
	f.ended, f.res, f.err = true, res, err
	f.settleReadies()
}

// fail ends a call that could not start or be reached.
func (f *Future) fail(err error) {
	f.markStarted(workflow.Execution{}, err)
	f.end(workflows.ActionResult{}, err)
}

// followChild waits for the child's end. cancelChild cancels it when the
// caller's context is canceled; nil means the SDK does, the child being
// started on that context.
func (f *Future) followChild(ctx workflow.Context, child workflow.ChildWorkflowFuture, cancelChild func()) {
	for !f.ended {
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(child, func(workflow.Future) {
			var res workflows.ActionResult
			err := child.Get(ctx, &res)
			f.end(res, durallm.ResultError(res, err))
		})
		f.addWaits(ctx, sel, cancelChild)
		sel.Select(ctx)
	}
}

// followExisting waits, through AwaitCall, for the end of an action this
// run did not start, from pos. A call (not a watch) cancels it when the
// caller's context is canceled, as it would its own child.
func (f *Future) followExisting(ctx workflow.Context, pos workflows.CallPosition) {
	var cancelAction func()
	if f.owner {
		runID := pos.RunID
		cancelAction = func() { _ = workflow.RequestCancelExternalWorkflow(ctx, f.id, runID) }
	}
	for {
		f.seePosition(ctx, pos)
		if f.ended {
			return
		}
		// A call's wait outlives the caller's cancellation, whose end it
		// waits for; a watch's ends with it.
		wctx := ctx
		if !f.owner {
			wctx = f.ctx
		}
		wctx = workflow.WithActivityOptions(wctx, workflow.ActivityOptions{
			TaskQueue: f.o.taskQueue,
			// It waits as long as the action runs, heartbeating: a lost
			// worker's wait is retried elsewhere, a long one goes on.
			StartToCloseTimeout: 24 * time.Hour,
			HeartbeatTimeout:    30 * time.Second,
			RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
			Summary:             "wait for action " + f.id,
		})
		known := pos
		known.Result = nil
		fut := workflow.ExecuteActivity(wctx, workflows.AwaitCall, workflows.CallQuery{ActionRef: f.id, RunID: pos.RunID, Awaiting: f.o.awaitFor > 0, Known: known})
		for !fut.IsReady() {
			sel := workflow.NewSelector(ctx)
			sel.AddFuture(fut, func(workflow.Future) {})
			f.addWaits(ctx, sel, cancelAction)
			sel.Select(ctx)
		}
		var next workflows.CallPosition
		if err := fut.Get(ctx, &next); err != nil {
			f.fail(f.callError(err))
			return
		}
		if next.RunID == "" {
			next.RunID = pos.RunID
		}
		pos = next
	}
}

// seePosition takes in where DescribeCall or AwaitCall found the action.
func (f *Future) seePosition(ctx workflow.Context, pos workflows.CallPosition) {
	if pos.Ended && pos.Result != nil {
		f.end(*pos.Result, durallm.ResultError(*pos.Result, nil))
		return
	}
	if f.o.awaitFor > 0 {
		f.see(ctx, pos.Awaiting, pos.Attempt, pos.Since)
	}
}

// addWaits adds to sel what the Future waits for besides the action's
// end: the action's signals, the caller's patience, and the caller's
// cancellation, which cancelAction passes on to the action.
func (f *Future) addWaits(ctx workflow.Context, sel workflow.Selector, cancelAction func()) {
	if f.notices != nil {
		sel.AddReceive(f.notices, func(c workflow.ReceiveChannel, _ bool) {
			var n workflows.AwaitingNotice
			c.Receive(ctx, &n)
			f.see(ctx, n.Awaiting, n.Attempt, n.Since)
		})
	}
	if t := f.timer; t != nil {
		sel.AddFuture(t, func(workflow.Future) {
			f.timer, f.cancelTimer = nil, nil
			// A canceled timer (the caller's own cancellation) is not the
			// end of its patience: the action's end follows.
			if t.Get(ctx, nil) == nil && f.awaiting {
				f.spend()
			}
		})
	}
	if done := f.ctx.Done(); done != nil && cancelAction != nil && !f.left && !f.cancelSent {
		sel.AddReceive(done, func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(ctx, nil)
			f.cancelSent = true
			cancelAction()
		})
	}
}

// see takes in that the action awaits a verdict on attempt since since
// (the action's time; zero when it did not say), or no longer awaits
// one, and starts the caller's patience for a new wait.
func (f *Future) see(ctx workflow.Context, awaiting bool, attempt int, since time.Time) {
	if awaiting == f.awaiting && attempt == f.attempt {
		return
	}
	if f.cancelTimer != nil {
		f.cancelTimer()
		f.timer, f.cancelTimer = nil, nil
	}
	f.awaiting, f.attempt, f.spent = awaiting, attempt, false
	if !awaiting {
		f.since = time.Time{}
		return
	}
	now := workflow.Now(ctx)
	if since.IsZero() || since.After(now) {
		since = now
	}
	f.since = since
	left := since.Add(f.o.awaitFor).Sub(now)
	if left <= 0 {
		f.spend()
		return
	}
	// On the caller's context: its cancellation ends the patience without
	// spending it.
	tctx, cancel := workflow.WithCancel(f.ctx)
	f.timer, f.cancelTimer = workflow.NewTimer(tctx, left), cancel
}

// spend ends the caller's patience with the current wait: Get returns
// early, and the call is left to its verdict.
func (f *Future) spend() {
	f.spent, f.left = true, true
	f.settleReadies()
}

// describe runs DescribeCall.
func (f *Future) describe(ctx workflow.Context, q workflows.CallQuery) (workflows.CallPosition, error) {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:           f.o.taskQueue,
		StartToCloseTimeout: time.Minute,
		// Until a durallm worker answers, as a child waits for one.
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 30 * time.Second},
		Summary:     "describe action " + q.ActionRef,
	})
	var pos workflows.CallPosition
	if err := workflow.ExecuteActivity(actx, workflows.DescribeCall, q).Get(actx, &pos); err != nil {
		return pos, f.callError(err)
	}
	return pos, nil
}

// callError is what Get returns for an error of DescribeCall or
// AwaitCall.
func (f *Future) callError(err error) error {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		switch app.Type() {
		case workflows.CallNotFoundType:
			return fmt.Errorf("step: action %s: %w: %w", f.id, durallm.ErrNotFound, err)
		case workflows.InvalidInputType:
			return durallm.ResultError(workflows.ActionResult{}, err)
		}
	}
	return err
}
