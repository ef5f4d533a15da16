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
// A call is named, and the name is its identity within the workflow's
// whole life: the action's id is the calling workflow's id, "-", and
// the name (ActionID), and a later run of the same workflow (a workflow
// retry, a reset, Continue-As-New, the next cron run) that makes a call
// of that name gets the same action: its result if it ended, or it waits
// for it. A call is never executed twice and never fails because its
// action exists. The same name twice in one run is the same call too. A
// new workflow started under the id of a closed one is another workflow:
// its calls are its own (see ActionID). A loop names each call after its
// turn, counted across Continue-As-New ("turn-7"), so that each turn is a
// call of its own; a new name is the way to ask for a new call.
//
// Errors are the Go client's: an *durallm.ActionError for every terminal
// state but completed, completed_partial and reconciled, an error
// matching durallm.ErrInvalidInput for an input LLMAction would reject
// (nothing is started), and with ReturnIfAwaiting an
// *durallm.AwaitingError (durallm.ErrAwaitingReconciliation). Decide with
// errors.Is and errors.As.
//
// Canceling the calling workflow (or the context a call was started
// with) cancels the call through Temporal: it ends canceled, origin
// parent_canceled, with no fallback and no move of provider health,
// unless its response committed first (then it ends completed or
// completed_partial, and Call returns the response). Call waits for that
// end, so the workflow always learns what the action did. A run that
// ends otherwise (completes, fails, continues as new, times out, is
// terminated) leaves its calls running to their own end, for a later run
// to collect. docs/workflow.md, "Calling from your own workflow", has the
// policies and why.
//
// Everything here is deterministic workflow code. A call that reaches an
// action its run did not start (a later run's, Attach) waits through the
// activities workflows.DescribeCall and workflows.AwaitCall, which
// durallm's workers run on the same task queue.
package step

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/net/http/httpguts"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/workflows"
)

// maxActionID bounds an action id: it is also the action's default
// idempotency key, which is at most 256 bytes.
const maxActionID = 256

// ActionID is the id of the action a workflow whose id is parentID
// starts with Call or StartCall under name: parentID + "-" + name. It is
// also the action's default idempotency key and its stream's id
// (/v1/streams/{id} on a worker), so an app can compute it before the
// call starts.
//
// When that is longer than 256 bytes, or is not a valid HTTP header
// value (a control character), the id is its longest prefix that is
// both within 223 bytes, "~", and 32 hex digits of its SHA-256: the same
// for the same parent and name, and within the idempotency key's limits
// whatever the parent's id.
//
// A new workflow started under the id of a closed one whose call of that
// name Temporal still keeps (within the namespace's retention) makes its
// call under ActionID(parentID, name + "@" + its first run's id) instead
// (Future.ActionID says which, once Future.Started is ready).
func ActionID(parentID, name string) string { return fitID(parentID + "-" + name) }

// fitID is id when it fits maxActionID and is a valid header value, else
// a readable prefix and a hash of the whole.
func fitID(id string) string {
	if len(id) <= maxActionID && httpguts.ValidHeaderFieldValue(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	h := hex.EncodeToString(sum[:16])
	keep, i := maxActionID-1-len(h), 0
	for i < len(id) {
		_, size := utf8.DecodeRuneInString(id[i:])
		if i+size > keep || !httpguts.ValidHeaderFieldValue(id[i:i+size]) {
			break
		}
		i += size
	}
	return id[:i] + "~" + h
}

// chainOf is the calling workflow's run chain: its first run's id, which
// a retry, a reset, a cron run and Continue-As-New keep, and a new
// workflow under the same id does not.
func chainOf(info *workflow.Info) string {
	if info.FirstRunID != "" {
		return info.FirstRunID
	}
	return info.WorkflowExecution.RunID // the SDK's test environment sets none
}

// Option changes how Call, StartCall and Attach reach an action.
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
// once the action has awaited a verdict on the same attempt for d,
// counted from when the action began to await it, so the workflow can go
// on without the answer. The action goes on too: it stays resolvable by
// the reconcile Update or signal (durallm reconcile, the temporal CLI, the
// UI) until its reconcile_timeout, and a later Get returns its end, or
// the error again, naming the attempt awaiting a verdict then. Once a
// call has awaited its verdict that long it is left to it: canceling the
// workflow no longer cancels it, since that would end it unresolved.
// d ≤ 0 means wait for the verdict, the default.
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

// StartCall starts one LLM action as a child workflow of the calling
// workflow and returns at once; or, when a run of this workflow already
// made the call of that name, the Future reaches that action instead. The
// action id is known before the action starts (Future.ActionID), so the
// workflow can hand it to the app behind it (a query handler, a memo, an
// activity) and the app can subscribe to the stream.
//
// The input is validated first, as LLMAction would: an invalid one starts
// nothing, and Get returns the error (durallm.ErrInvalidInput). So does an
// empty name.
func StartCall(ctx workflow.Context, name string, in workflows.ActionInput, opts ...Option) *Future {
	o := newOptions(opts)
	info := workflow.GetInfo(ctx)
	f := newFuture(ctx, ActionID(info.WorkflowExecution.ID, name), o, true)
	if name == "" {
		f.fail(fmt.Errorf("%w: step: empty call name", durallm.ErrInvalidInput))
		return f
	}
	if err := in.WithDefaults(f.id).Validate(); err != nil {
		f.fail(err) // an *workflows.InputError, which is ErrInvalidInput
		return f
	}
	if err := checkInline(ctx, in); err != nil {
		f.fail(err)
		return f
	}
	if o.awaitFor > 0 {
		in.NotifyParent = true
	}
	c := &call{f: f, in: in, base: info.WorkflowExecution.ID + "-" + name, parentID: info.WorkflowExecution.ID, chain: chainOf(info)}
	// Started here, not in the coroutine, so that the command comes in
	// the order the workflow made the call.
	c.start()
	workflow.Go(f.dctx, c.follow)
	return f
}

// Attach reaches an action by its id, started by an earlier run of this
// workflow before a Continue-As-New, by another workflow, or by a client,
// and returns its Future: Get waits for its end (with ReturnIfAwaiting,
// at most until it has awaited a verdict that long), Ready and Started
// work as for a call. Attaching only watches: canceling the workflow
// stops the wait (Get returns the cancellation) and leaves the action
// alone; to stop the action too, send it the cancel signal
// (workflows.SignalCancel). An id Temporal keeps no action under is an
// error matching durallm.ErrNotFound.
//
// It waits through the activities workflows.DescribeCall and
// workflows.AwaitCall on the durallm task queue (TaskQueue).
func Attach(ctx workflow.Context, actionID string, opts ...Option) *Future {
	f := newFuture(ctx, actionID, newOptions(opts), false)
	if actionID == "" {
		f.fail(fmt.Errorf("%w: step: empty action id", durallm.ErrInvalidInput))
		return f
	}
	if f.o.awaitFor > 0 {
		f.notices = workflow.GetSignalChannel(ctx, workflows.ParentSignalName(actionID))
	}
	workflow.Go(f.dctx, func(ctx workflow.Context) {
		pos, err := f.describe(ctx, workflows.CallQuery{ActionRef: actionID, Awaiting: f.o.awaitFor > 0})
		switch {
		case err != nil:
			f.fail(err)
		case !pos.Found:
			f.fail(fmt.Errorf("step: attach %s: %w", actionID, durallm.ErrNotFound))
		default:
			f.markStarted(workflow.Execution{ID: actionID, RunID: pos.RunID}, nil)
			f.followExisting(ctx, pos)
		}
	})
	return f
}

func newOptions(opts []Option) options {
	o := options{taskQueue: durallm.DefaultTaskQueue}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// call is a StartCall's start: the child, and when its id is taken, the
// action to reach instead.
type call struct {
	f                     *Future
	in                    workflows.ActionInput
	base, parentID, chain string
	derived               bool

	child       workflow.ChildWorkflowFuture
	cancelChild func() // nil when the child is canceled with the caller's context
}

// start starts the child under f.id.
func (c *call) start() {
	f := c.f
	// Whatever happens to the run that starts it, the action runs to its
	// end: a later run of this workflow (a retry, Continue-As-New) may
	// wait for it. Canceling the caller's context cancels it (below).
	opts := workflow.ChildWorkflowOptions{
		WorkflowID: f.id,
		TaskQueue:  f.o.taskQueue,
		// The caller learns how the action ended, canceled or not (the Go
		// SDK waits for a child's close either way; this says so).
		WaitForCancellation: true,
		ParentClosePolicy:   enumspb.PARENT_CLOSE_POLICY_ABANDON,
		// One id, one action, once: never a second execution under the
		// same idempotency key. A taken id is reached instead (follow).
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
	}
	cctx := f.ctx
	if f.o.awaitFor > 0 {
		// A call the caller may leave to its verdict must not be canceled
		// with the caller once it has: the SDK cancels a child with the
		// context it was started on, so this one is canceled by hand
		// (follow) until then.
		f.notices = workflow.GetSignalChannel(f.ctx, workflows.ParentSignalName(f.id))
		if f.ctx.Err() != nil {
			c.child = nil
			return
		}
		var cancel workflow.CancelFunc
		cctx, cancel = workflow.WithCancel(f.dctx)
		c.cancelChild = func() { cancel() }
	}
	c.child = workflow.ExecuteChildWorkflow(workflow.WithChildOptions(cctx, opts), workflows.WorkflowName, c.in)
}

// follow waits for the child's start and then its end. When the action
// id is taken, it reaches the action that has it, if this workflow's run
// chain started it; if another workflow did (a closed one under the same
// id), it makes the call under an id of this chain's own.
func (c *call) follow(ctx workflow.Context) {
	f := c.f
	for range 5 {
		if c.child == nil {
			f.fail(temporal.NewCanceledError("step: the call's workflow was canceled before the call started"))
			return
		}
		started := c.child.GetChildWorkflowExecution()
		_ = workflow.Await(ctx, func() bool { return started.IsReady() || c.child.IsReady() })
		var we workflow.Execution
		var err error
		if started.IsReady() {
			err = started.Get(ctx, &we)
		} else { // a start the SDK refused without settling it
			err = c.child.Get(ctx, nil)
		}
		if err == nil {
			f.markStarted(we, nil)
			f.followChild(ctx, c.child, c.cancelChild)
			return
		}
		if !alreadyStarted(err) {
			var res workflows.ActionResult
			if c.child.IsReady() {
				err = c.child.Get(ctx, &res)
			}
			f.fail(durallm.ResultError(res, err))
			return
		}
		// Histories recorded before a taken id was reached end here.
		if workflow.GetVersion(ctx, "durallm-step-reach-existing", workflow.DefaultVersion, 1) == workflow.DefaultVersion {
			f.fail(fmt.Errorf("step: action %s: %w: %w", f.id, durallm.ErrActionExists, err))
			return
		}
		pos, err := f.describe(ctx, workflows.CallQuery{ActionRef: f.id, ParentID: c.parentID, Chain: c.chain, Awaiting: f.o.awaitFor > 0})
		switch {
		case err != nil:
			f.fail(err)
			return
		case !pos.Found:
			// Not yet started (this run's own start of the same name,
			// still on its way) or gone since (its retention ended):
			// look again after a second, by starting it.
			_ = workflow.Sleep(ctx, time.Second)
		case pos.OtherChain && !c.derived:
			c.derived, f.id = true, fitID(c.base+"@"+c.chain)
		default:
			f.markStarted(workflow.Execution{ID: f.id, RunID: pos.RunID}, nil)
			f.followExisting(ctx, pos)
			return
		}
		if f.ctx.Err() != nil {
			f.fail(temporal.NewCanceledError("step: the call's workflow was canceled before the call started"))
			return
		}
		c.start()
	}
	f.fail(fmt.Errorf("step: action %s could be neither started nor found", f.id))
}

// alreadyStarted reports a child start refused because the id is taken:
// a ChildWorkflowExecutionAlreadyStartedError on a server, a
// serviceerror.WorkflowExecutionAlreadyStarted in the SDK's test
// environment.
func alreadyStarted(err error) bool {
	var child *temporal.ChildWorkflowExecutionAlreadyStartedError
	var svc *serviceerror.WorkflowExecutionAlreadyStarted
	return errors.As(err, &child) || errors.As(err, &svc)
}
