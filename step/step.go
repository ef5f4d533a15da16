// Package step runs a durable LLM call as one step of your own Temporal
// workflow: an agent, a document pipeline, a support bot.
//
//	res, err := step.Call(ctx, "summary", workflows.ActionInput{
//		Request: providers.Request{Messages: msgs},
//		Routes:  []string{"openai-primary", "local-fallback"},
//	})
//	var ae *durallm.ActionError
//	if errors.As(err, &ae) { ... ae.State, ae.Outcome, ae.Origin ... }
//
// Each call is one LLMAction, run as a child workflow of the calling
// workflow on the durallm workers' task queue, with every guarantee an
// action has: one attempt budget, the recovery engine's evidence,
// reconciliation of an ambiguous attempt instead of a blind retry. The
// calling workflow's worker needs nothing of durallm's: no routes, no
// keys, no engine; a durallm worker polling the task queue runs the call.
//
// The action's id is the calling workflow's id, "-", and the call's name
// (ActionID), so a parent replayed after its worker died finds the same
// action in its history instead of starting a second one, and an app
// that knows the parent's id can subscribe to the call's stream before
// it starts. Names must be unique within one workflow.
//
// Errors are the Go client's: an *durallm.ActionError for every terminal
// state but completed, completed_partial and reconciled, an error
// matching durallm.ErrInvalidInput for an input LLMAction would reject
// (nothing is started), and with ReturnIfAwaiting an
// *durallm.AwaitingError (durallm.ErrAwaitingReconciliation). Decide with
// errors.Is and errors.As.
//
// Canceling the calling workflow cancels the action through Temporal: it
// ends canceled, origin parent_canceled, with no fallback and no move of
// provider health, unless its response committed first (then it ends
// completed or completed_partial, and Call returns the response). Call
// waits for that end, so the parent always learns what the action did.
// docs/workflow.md, "Calling from your own workflow", has the policies
// and why.
//
// Everything here is deterministic workflow code.
package step

import (
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/workflows"
)

// ActionID is the id of the action a workflow whose id is parentID
// starts with Call or StartCall under name: parentID + "-" + name. It is
// also the action's default idempotency key and its stream's id
// (/v1/streams/{id} on a worker), so an app can compute it before the
// call starts.
func ActionID(parentID, name string) string { return parentID + "-" + name }

// Option changes how Call and StartCall run an action.
type Option func(*options)

type options struct {
	taskQueue string
	awaitFor  time.Duration
}

// TaskQueue names the task queue the durallm workers poll. Default
// durallm.DefaultTaskQueue ("durallm"); an empty name keeps it.
func TaskQueue(name string) Option {
	return func(o *options) {
		if name != "" {
			o.taskQueue = name
		}
	}
}

// ReturnIfAwaiting makes Call (and Future.Get) return an
// *durallm.AwaitingError, which matches durallm.ErrAwaitingReconciliation,
// once the action has awaited a verdict on the same attempt for d, so the
// workflow can go on without the answer. The action goes on too: it stays
// resolvable by the reconcile Update or signal (durallm reconcile, the
// temporal CLI, the UI) until its reconcile_timeout, and a later Get
// returns its end. Because the workflow may now end before the action
// does, such an action outlives its parent (PARENT_CLOSE_POLICY_ABANDON):
// canceling it then would end it unresolved. d ≤ 0 means wait for the
// verdict, the default.
//
// To learn that the action awaits a verdict, the calling workflow
// receives a signal from it (workflows.ParentSignalName): one history
// event each time the action enters or leaves the wait.
func ReturnIfAwaiting(d time.Duration) Option {
	return func(o *options) { o.awaitFor = d }
}

// Call runs one LLM action as a child workflow and waits for its end
// (with ReturnIfAwaiting, at most until it has awaited a verdict that
// long). It is StartCall(...).Get(ctx).
func Call(ctx workflow.Context, name string, in workflows.ActionInput, opts ...Option) (workflows.ActionResult, error) {
	return StartCall(ctx, name, in, opts...).Get(ctx)
}

// Future is an action started by StartCall. Use it from the workflow that
// started it only.
type Future struct {
	id       string
	err      error // the call could not start
	child    workflow.ChildWorkflowFuture
	awaitFor time.Duration
	notices  workflow.ReceiveChannel

	// While the action awaits a verdict: on which attempt, since when, and
	// the timer that ends the caller's patience.
	awaiting    bool
	attempt     int
	since       time.Time
	timer       workflow.Future
	cancelTimer workflow.CancelFunc
	timedOut    bool
}

// StartCall starts one LLM action as a child workflow of the calling
// workflow and returns at once. The action id is known before the action
// starts (Future.ActionID), so the workflow can hand it to the app behind
// it (a query handler, a memo, an activity) and the app can subscribe to
// the stream.
//
// The input is validated first, as LLMAction would: an invalid one starts
// nothing, and Get returns the error (durallm.ErrInvalidInput). So does an
// empty name, or a name already used by an earlier call of this workflow
// (the action with that id already exists).
func StartCall(ctx workflow.Context, name string, in workflows.ActionInput, opts ...Option) *Future {
	o := options{taskQueue: durallm.DefaultTaskQueue}
	for _, opt := range opts {
		opt(&o)
	}
	id := ActionID(workflow.GetInfo(ctx).WorkflowExecution.ID, name)
	f := &Future{id: id, awaitFor: o.awaitFor}
	if name == "" {
		f.err = fmt.Errorf("%w: step: empty call name", durallm.ErrInvalidInput)
		return f
	}
	if err := in.WithDefaults(id).Validate(); err != nil {
		f.err = err // an *workflows.InputError, which is ErrInvalidInput
		return f
	}
	if err := checkInline(ctx, in); err != nil {
		f.err = err
		return f
	}
	// A terminated or timed-out parent must not leave an attempt running
	// with nobody to settle it: TERMINATE (Temporal's default) would end
	// the action while its attempt may still run on a worker. A cancel
	// request lets the action cancel its attempt, wait for its evidence
	// and end canceled. An action the caller may leave awaiting a verdict
	// must outlive it instead, or nobody could resolve it.
	policy := enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL
	if o.awaitFor > 0 {
		policy = enumspb.PARENT_CLOSE_POLICY_ABANDON
		in.NotifyParent = true
		f.notices = workflow.GetSignalChannel(ctx, workflows.ParentSignalName(id))
	}
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID: id,
		TaskQueue:  o.taskQueue,
		// The parent learns how the action ended, canceled or not (the Go
		// SDK waits for a child's close either way; this says so).
		WaitForCancellation: true,
		ParentClosePolicy:   policy,
		// One id, one action, once: never a second execution under the
		// same idempotency key.
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	})
	f.child = workflow.ExecuteChildWorkflow(cctx, workflows.WorkflowName, in)
	return f
}

// ActionID is the action's id (see the package function ActionID).
func (f *Future) ActionID() string { return f.id }

// IsReady reports whether the action has ended (or could not start), so
// that Get returns its end without blocking.
func (f *Future) IsReady() bool { return f.err != nil || f.child.IsReady() }

// Get waits for the action's end and returns its result, with the errors
// described in the package doc. With ReturnIfAwaiting it returns an
// *durallm.AwaitingError instead once the action has awaited a verdict on
// one attempt for the option's duration; called again while the action
// still awaits it, it returns that error at once.
func (f *Future) Get(ctx workflow.Context) (workflows.ActionResult, error) {
	if f.err != nil {
		return workflows.ActionResult{}, f.err
	}
	for f.notices != nil && !f.child.IsReady() {
		if f.timedOut {
			return workflows.ActionResult{}, &durallm.AwaitingError{ActionRef: f.id, Attempt: f.attempt, Since: f.since}
		}
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(f.child, func(workflow.Future) {})
		sel.AddReceive(f.notices, func(c workflow.ReceiveChannel, _ bool) {
			var n workflows.AwaitingNotice
			c.Receive(ctx, &n)
			f.notice(ctx, n)
		})
		if t := f.timer; t != nil {
			sel.AddFuture(t, func(workflow.Future) {
				f.timer = nil
				// A canceled timer (the caller's own cancellation) is not
				// the end of its patience: the action's end follows.
				f.timedOut = t.Get(ctx, nil) == nil && f.awaiting
			})
		}
		sel.Select(ctx)
	}
	var res workflows.ActionResult
	err := f.child.Get(ctx, &res)
	var exists *temporal.ChildWorkflowExecutionAlreadyStartedError
	if errors.As(err, &exists) {
		return res, fmt.Errorf("step: action %s already exists (a second call with the same name, or an earlier run of this workflow made it): %w", f.id, err)
	}
	return res, durallm.ResultError(res, err)
}

// notice applies one of the action's signals: the wait for a verdict
// begins (and with it the caller's timer), or a verdict ended it.
func (f *Future) notice(ctx workflow.Context, n workflows.AwaitingNotice) {
	if f.cancelTimer != nil {
		f.cancelTimer()
		f.cancelTimer, f.timer = nil, nil
	}
	f.awaiting, f.timedOut = n.Awaiting, false
	if !n.Awaiting {
		return
	}
	f.attempt, f.since = n.Attempt, workflow.Now(ctx)
	tctx, cancel := workflow.WithCancel(ctx)
	f.timer, f.cancelTimer = workflow.NewTimer(tctx, f.awaitFor), cancel
}
