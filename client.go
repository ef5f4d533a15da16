// Package durallm is the app-facing API: start an LLM action, wait for its
// result, cancel it with an origin, reconcile an ambiguous one, read its
// status. Each action is one LLMAction workflow (package workflows) on a
// Temporal server; a durallm worker (package worker) must be polling the
// same task queue.
//
// Dial the Temporal client with DataConverter over the workers' result
// store, so that a request of any size up to the store's limit travels
// by reference instead of through history:
//
//	store := resultstore.Dir{Path: "/shared/durallm-results"}
//	temporalClient, err := client.Dial(client.Options{DataConverter: durallm.DataConverter(store)})
//	c := durallm.NewClient(temporalClient, "durallm").WithResults(store)
//	act, err := c.Start(ctx, "order-42-summary", workflows.ActionInput{...})
//	res, err := act.Result(ctx)
//	var ae *durallm.ActionError
//	if errors.As(err, &ae) { ... ae.State, ae.Outcome ... }
package durallm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/workflows"
)

// DefaultTaskQueue is the task queue durallm's worker polls unless told
// otherwise.
const DefaultTaskQueue = attempt.DefaultTaskQueue

// Client starts and steers actions. It is safe for concurrent use.
type Client struct {
	tc        client.Client
	taskQueue string
	namespace string
	results   resultstore.Store
	eager     bool
	dc        converter.DataConverter
}

// NewClient wraps a Temporal client. An empty taskQueue means
// DefaultTaskQueue.
func NewClient(tc client.Client, taskQueue string) *Client {
	if taskQueue == "" {
		taskQueue = DefaultTaskQueue
	}
	return &Client{tc: tc, taskQueue: taskQueue}
}

// DataConverter is the data converter every Temporal client and worker of
// durallm's workflows is dialed with (client.Options.DataConverter): the
// SDK's default, with every payload over claimcheck.DefaultThreshold (2
// KiB) kept in store and a reference to it in history. store is the
// workers' result store (resultstore.Dir, pgstore.Store), shared by every
// process that reads or writes the workflows. A worker of your own that
// calls durallm with package step needs it too, or its workflow's history
// holds each call's whole request. claimcheck.DataConverter takes options
// (a threshold, encryption keys).
func DataConverter(store resultstore.Store) converter.DataConverter {
	return claimcheck.DataConverter(store, claimcheck.Options{})
}

// WithResults makes Result resolve responses the worker stored by
// reference (too large for history) from s, which must be the store the
// workers write to: resultstore.Dir for "file:" references, or, for
// workers started with a journal DSN, pgstore.Connect's store for "pg:"
// references (package resultstore/pgstore, which alone brings in the
// PostgreSQL driver). It returns c.
func (c *Client) WithResults(s resultstore.Store) *Client {
	c.results = s
	return c
}

// WithEagerStart asks the server to hand each new action's first workflow
// task straight back to a worker in this process (eager workflow start),
// saving a round trip; it only helps when the client and a worker share
// one Temporal client. It returns c.
func (c *Client) WithEagerStart() *Client {
	c.eager = true
	return c
}

// WithDataConverter gives the client the data converter its Temporal
// client was dialed with (codec.DataConverter when payloads are
// encrypted), so that Describe can read memos and heartbeat details. Nil,
// the default, means the SDK's default converter. It returns c.
func (c *Client) WithDataConverter(dc converter.DataConverter) *Client {
	c.dc = dc
	return c
}

// WithNamespace names the namespace its Temporal client was dialed with,
// which Delete needs (the SDK's client does not say). Empty, the
// default, means "default". It returns c.
func (c *Client) WithNamespace(ns string) *Client {
	c.namespace = ns
	return c
}

func (c *Client) converter() converter.DataConverter {
	if c.dc != nil {
		return c.dc
	}
	return converter.GetDefaultDataConverter()
}

// ErrInvalidInput matches (errors.Is) the error of an action whose input
// was rejected, at start or by the workflow; nothing was dispatched. It is
// workflows.ErrInvalidInput: one idea, whichever side found the problem.
var ErrInvalidInput = workflows.ErrInvalidInput

// ErrNotFound matches an action id that does not exist.
var ErrNotFound = errors.New("durallm: action not found")

// ErrActionExists matches (errors.Is) a start whose action id is taken,
// by a running action or by an ended one Temporal still keeps; nothing was
// started. The error also wraps serviceerror.WorkflowExecutionAlreadyStarted.
var ErrActionExists = errors.New("durallm: action id already used")

// ActionError is the error of an action that ended in a state other than
// completed, completed_partial or reconciled. Use errors.As to read it.
type ActionError struct {
	ActionRef string
	// State is the terminal state: failed, rejected, canceled,
	// indeterminate or spend_exhausted.
	State workflows.State
	// Outcome is the last attempt's classification (or the verdict).
	Outcome string
	// Reason is the machine-readable reason, e.g. "budget_exhausted".
	Reason string
	// Origin is set when State is canceled.
	Origin workflows.CancelOrigin
	// Result is the whole terminal result, timeline included.
	Result workflows.ActionResult
}

func (e *ActionError) Error() string {
	s := fmt.Sprintf("durallm: action %s ended %s (%s: %s)", e.ActionRef, e.State, e.Outcome, e.Reason)
	if e.Origin != "" {
		s += " by " + string(e.Origin)
	}
	return s
}

// ErrAwaitingReconciliation matches (errors.Is) the error of a wait that
// gave up while the action awaits a reconciliation verdict: the action
// goes on, and stays resolvable by the reconcile Update or signal
// (Client.Reconcile, durallm reconcile, the temporal CLI, the UI). The
// error is an *AwaitingError naming the action and the attempt.
var ErrAwaitingReconciliation = errors.New("durallm: action awaiting reconciliation")

// AwaitingError is ErrAwaitingReconciliation for one action. Use
// errors.As to read it.
type AwaitingError struct {
	ActionRef string
	// Attempt is the attempt a verdict must name
	// (ReconcileRequest.Attempt).
	Attempt int
	// Since is when the action began to await the verdict (the action's
	// workflow time; for an action that does not say, the caller's when
	// it learned of it).
	Since time.Time
}

func (e *AwaitingError) Error() string {
	return fmt.Sprintf("durallm: action %s awaits a reconciliation verdict on attempt %d", e.ActionRef, e.Attempt)
}

// Is reports that an AwaitingError is ErrAwaitingReconciliation.
func (e *AwaitingError) Is(target error) bool { return target == ErrAwaitingReconciliation }

// Action is a handle on one started action.
type Action struct {
	c     *Client
	ID    string
	RunID string
}

// Start validates the input and starts an action with the given id (the
// action ref; it is also the default idempotency key). An invalid input
// returns ErrInvalidInput (errors.Is) naming every bad field, and starts
// nothing; so does an input larger than the result store keeps (it also
// matches resultstore.ErrTooLarge), when the Temporal client was dialed
// with DataConverter. Starting an id that is already taken, by a running action or
// an ended one, returns an error wrapping
// serviceerror.WorkflowExecutionAlreadyStarted and starts nothing.
func (c *Client) Start(ctx context.Context, id string, in workflows.ActionInput) (*Action, error) {
	return c.StartWith(ctx, id, in, StartOptions{})
}

// StartOptions are Start's less common settings.
type StartOptions struct {
	// Memo is kept with the action, encrypted by the payload codec when
	// one is on, and read back with Describe. Nil means none. It is not
	// history: nothing the workflow replays depends on it.
	Memo map[string]any
}

// StartWith is Start with options. The action id is never reused while
// Temporal keeps the action, running or ended (the workflow id reuse
// policy rejects duplicates and the conflict policy fails on a running
// one): a taken id is ErrActionExists, and the caller decides, with
// Describe, whether the existing action is the one it meant.
func (c *Client) StartWith(ctx context.Context, id string, in workflows.ActionInput, o StartOptions) (*Action, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: empty action id", ErrInvalidInput)
	}
	// The workflow validates too; checking here means a bad input starts
	// nothing at all.
	if err := in.WithDefaults(id).Validate(); err != nil {
		return nil, err // an *workflows.InputError, which is ErrInvalidInput
	}
	run, err := c.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       id,
		TaskQueue:                c.taskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		// Without it the SDK hands back the existing run for an id that is
		// taken, and the caller would read the old action's result as if a
		// new action had run.
		WorkflowExecutionErrorWhenAlreadyStarted: true,
		EnableEagerStart:                         c.eager,
		Memo:                                     o.Memo,
	}, workflows.WorkflowName, in)
	var exists *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &exists) {
		return nil, fmt.Errorf("durallm: start action %s: %w: %w", id, ErrActionExists, err)
	}
	if errors.Is(err, resultstore.ErrTooLarge) {
		return nil, tooLarge(err)
	}
	if err != nil {
		return nil, fmt.Errorf("durallm: start action %s: %w", id, err)
	}
	return &Action{c: c, ID: run.GetID(), RunID: run.GetRunID()}, nil
}

// Get returns a handle on an existing action (its latest run).
func (c *Client) Get(id string) *Action { return &Action{c: c, ID: id} }

// Result waits for the action's terminal result. The error is nil for
// completed, completed_partial and reconciled; an *ActionError for the
// other terminal states; ErrInvalidInput (errors.Is) when the input was
// rejected; otherwise the Temporal error.
func (a *Action) Result(ctx context.Context) (workflows.ActionResult, error) {
	var res workflows.ActionResult
	err := a.c.tc.GetWorkflow(ctx, a.ID, a.RunID).Get(ctx, &res)
	if err != nil {
		return res, mapNotFound(a.ID, ResultError(res, err))
	}
	if err := a.c.resolve(ctx, &res); err != nil {
		return res, err
	}
	return res, ResultError(res, nil)
}

// ResultError is the error for what an LLMAction execution returned, its
// result or the error it failed with, as Action.Result and step.Call
// report it: nil for a result that is completed, completed_partial or
// reconciled; an *ActionError for the other terminal states; an error
// matching ErrInvalidInput for an execution the workflow failed as
// invalid input, or for one never started because its input was larger
// than the caller's result store keeps (resultstore.ErrTooLarge);
// otherwise err itself.
func ResultError(res workflows.ActionResult, err error) error {
	if errors.Is(err, resultstore.ErrTooLarge) {
		// A caller's input its data converter could not store: nothing
		// was started.
		return tooLarge(err)
	}
	if err != nil {
		var app *temporal.ApplicationError
		if errors.As(err, &app) && app.Type() == workflows.InvalidInputType {
			return &workflows.InputError{Problems: []error{errors.New(app.Message())}}
		}
		return err
	}
	switch res.State {
	case workflows.StateCompleted, workflows.StateCompletedPartial, workflows.StateReconciled:
		return nil
	}
	return &ActionError{ActionRef: res.ActionRef, State: res.State, Outcome: res.Outcome, Reason: res.Reason, Origin: res.Origin, Result: res}
}

// tooLarge is the error of an input larger than the result store keeps:
// an invalid input, which also matches resultstore.ErrTooLarge.
func tooLarge(err error) error {
	return &workflows.InputError{Problems: []error{fmt.Errorf("request: larger than the result store keeps, so nothing was started: %w", err)}}
}

// resolve fetches a response stored by reference (ResolveResponse).
func (c *Client) resolve(ctx context.Context, res *workflows.ActionResult) error {
	if c.results == nil {
		return nil
	}
	return ResolveResponse(ctx, c.results, res)
}

// ResolveResponse fills res.Response from store when the worker stored
// the response by reference (res.ResultRef and no Response: every durallm
// worker stores one over 256 KiB), as Action.Result does. A reference the
// store does not understand (a verdict's own result_ref) is left as it
// is, Response nil. Workflow code cannot read a store: a workflow that
// calls step resolves its answers in an activity of its own with this
// (examples/agent, Activities.ReadResponse).
func ResolveResponse(ctx context.Context, store resultstore.Store, res *workflows.ActionResult) error {
	if res.Response != nil || res.ResultRef == "" {
		return nil
	}
	b, err := store.Get(ctx, res.ResultRef)
	if errors.Is(err, resultstore.ErrBadRef) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("durallm: action %s: resolve its stored response: %w", res.ActionRef, err)
	}
	var r providers.Response
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("durallm: action %s: decode its stored response: %w", res.ActionRef, err)
	}
	res.Response = &r
	return nil
}

// Cancel ends an action's scope with an origin (user_stop,
// client_disconnect or operator_stop). The in-flight attempt is canceled
// through its heartbeat; the action ends canceled. A cancel that arrives
// after the terminal state is recorded and ignored.
func (c *Client) Cancel(ctx context.Context, id string, origin workflows.CancelOrigin, note string) error {
	if !origin.Requestable() {
		return fmt.Errorf("%w: cancel origin %q: want user_stop, client_disconnect or operator_stop", ErrInvalidInput, origin)
	}
	err := c.tc.SignalWorkflow(ctx, id, "", workflows.SignalCancel, workflows.CancelRequest{Origin: origin, Note: note})
	return mapNotFound(id, err)
}

// ErrRunning is returned by Delete for an action that still runs: only
// an ended action is deleted, so that nothing ends an action's scope
// but its cancel (a deletion would terminate it).
var ErrRunning = errors.New("durallm: action still running")

// tombstoneType is the workflow type of a deleted action's tombstone,
// which no worker runs: it only has to exist.
const tombstoneType = "DurallmDeleted"

// tombstoneID is the id of the tombstone of one run of an action: a new
// action started with the same id, once Temporal has removed the old one,
// has another run and is not deleted.
func tombstoneID(id, runID string) string { return "durallm-deleted:" + runID + ":" + id }

// Delete deletes an ended action. Temporal removes its history, memo and
// visibility record in the background, once its own queues allow (up to
// a minute or so); until then, and for the namespace's retention after,
// a tombstone says the run was deleted (Deleted), so that every client
// treats it as gone at once. Once removed, its action id may be started
// again. What it kept by reference in the result store goes at the
// store's next sweep once a retention old, as an expired action's does.
// A running action is ErrRunning: cancel it first. Deleting a deleted
// action is no error.
func (c *Client) Delete(ctx context.Context, id string) error {
	d, err := c.Describe(ctx, id)
	if err != nil {
		return err
	}
	if d.Running {
		return fmt.Errorf("%w: %s", ErrRunning, id)
	}
	// The tombstone is a run that closes by itself within a second: it
	// sits on a task queue no worker polls, and its execution timeout
	// ends it. Only its existence is read.
	_, err = c.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: tombstoneID(id, d.RunID), TaskQueue: c.taskQueue + "-deleted",
		WorkflowExecutionTimeout:                 time.Second,
		WorkflowIDReusePolicy:                    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy:                 enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowExecutionErrorWhenAlreadyStarted: true,
	}, tombstoneType)
	var exists *serviceerror.WorkflowExecutionAlreadyStarted
	if err != nil && !errors.As(err, &exists) {
		return fmt.Errorf("durallm: delete %s: %w", id, err)
	}
	ns := c.namespace
	if ns == "" {
		ns = "default"
	}
	_, err = c.tc.WorkflowService().DeleteWorkflowExecution(ctx, &workflowservice.DeleteWorkflowExecutionRequest{
		Namespace: ns, WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: id, RunId: d.RunID},
	})
	var nf *serviceerror.NotFound
	if err != nil && !errors.As(err, &nf) {
		return fmt.Errorf("durallm: delete %s: %w", id, err)
	}
	return nil
}

// Deleted reports whether the run runID of the action id was deleted
// (Delete), which Temporal may not have carried out yet.
func (c *Client) Deleted(ctx context.Context, id, runID string) (bool, error) {
	_, err := c.tc.DescribeWorkflowExecution(ctx, tombstoneID(id, runID), "")
	var nf *serviceerror.NotFound
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &nf):
		return false, nil
	}
	return false, fmt.Errorf("durallm: is %s deleted: %w", id, err)
}

// Input returns the input the action was started with (its latest run
// when runID is empty), from the first event of its history, decoded
// with the client's data converter (WithDataConverter): a request stored
// by reference is read from the result store. An action Temporal does
// not know is ErrNotFound.
func (c *Client) Input(ctx context.Context, id, runID string) (workflows.ActionInput, error) {
	var in workflows.ActionInput
	it := c.tc.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	if !it.HasNext() {
		return in, fmt.Errorf("%w: %s: no history", ErrNotFound, id)
	}
	ev, err := it.Next()
	if err != nil {
		return in, mapNotFound(id, err)
	}
	a := ev.GetWorkflowExecutionStartedEventAttributes()
	if a == nil {
		return in, fmt.Errorf("durallm: action %s: its history does not start with its input", id)
	}
	if err := c.converter().FromPayloads(a.GetInput(), &in); err != nil {
		return in, fmt.Errorf("durallm: action %s: decode its input: %w", id, err)
	}
	return in, nil
}

// ReconcileError is returned when the action rejected a reconcile Update
// (wrong state, stale attempt, unknown verdict). Nothing was written.
type ReconcileError struct {
	ActionRef string
	// Reason is why, one of workflows.RejectNotAwaiting,
	// RejectVerdictPending, RejectStaleAttempt, RejectInvalidVerdict, or
	// RejectEnded when the action had already ended; decide on it, never
	// on Message.
	Reason  string
	Message string
}

// RejectEnded is the ReconcileError reason for an action that has already
// ended: its Update handler is gone, so the server answers "not found".
const RejectEnded = "ActionEnded"

func (e *ReconcileError) Error() string {
	return "durallm: reconcile " + e.ActionRef + " rejected: " + e.Message
}

// Reconcile delivers a verdict on the action's ambiguous attempt through
// the validated Update and waits until it is accepted. A rejection is a
// *ReconcileError.
//
// Right after a worker is lost, the first Update can reach a worker whose
// copy of the workflow has not yet caught up with the timeout that made
// the attempt ambiguous, and be rejected as "not awaiting reconciliation"
// although the action is. Reconcile then re-reads the status and, if it
// says the action awaits this very attempt, tries again (at most three
// times, 250ms apart). Every other rejection is returned at once.
func (c *Client) Reconcile(ctx context.Context, id string, r workflows.ReconcileRequest) error {
	var err error
	for try := 0; try < 3; try++ {
		if err = c.reconcileOnce(ctx, id, r); err == nil {
			return nil
		}
		if errors.Is(err, ErrNotFound) {
			// A closed action rejects Updates as "not found"; say what
			// actually happened if the action exists.
			if st, serr := c.Status(ctx, id); serr == nil && st.State.Terminal() {
				return &ReconcileError{ActionRef: id, Reason: RejectEnded, Message: "the action already ended " + string(st.State)}
			}
			return err
		}
		var rerr *ReconcileError
		if !errors.As(err, &rerr) || rerr.Reason != workflows.RejectNotAwaiting {
			return err
		}
		st, serr := c.Status(ctx, id)
		if serr != nil || st.State != workflows.StateAwaitingReconciliation || st.AwaitingAttempt != r.Attempt {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
	return err
}

func (c *Client) reconcileOnce(ctx context.Context, id string, r workflows.ReconcileRequest) error {
	h, err := c.tc.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID:   id,
		UpdateName:   workflows.UpdateReconcile,
		Args:         []any{r},
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err != nil {
		return mapUpdateErr(id, err)
	}
	var ack string
	if err := h.Get(ctx, &ack); err != nil {
		return mapUpdateErr(id, err)
	}
	return nil
}

// Description is what Temporal keeps of an action beside its history:
// whether it runs, when it started and closed, its memo, and the progress
// its running attempts last reported.
type Description struct {
	ID, RunID string
	// Running is true until the action's workflow closes.
	Running bool
	// StartTime is when the action started; CloseTime when it closed
	// (zero while it runs).
	StartTime, CloseTime time.Time
	// Attempts are the running attempts.
	Attempts []RunningAttempt

	memo *commonpb.Memo
	dc   converter.DataConverter
}

// RunningAttempt is what Temporal knows of a running attempt.
type RunningAttempt struct {
	// ActivityID names the attempt's activity, unique within the action.
	ActivityID string
	// Started says a worker took it.
	Started bool
	// StreamURL is where the worker running it serves its stream, from
	// the worker's identity (attempt.StreamIdentity) or the attempt's last
	// heartbeat; "" when it advertises none.
	StreamURL string
	// Progress is the attempt's last heartbeat; zero before the first.
	Progress attempt.Progress
}

// Memo decodes the memo field key into v. It reports false, with a nil
// error, when the action has no such field.
func (d Description) Memo(key string, v any) (bool, error) {
	p, ok := d.memo.GetFields()[key]
	if !ok {
		return false, nil
	}
	if err := d.dc.FromPayload(p, v); err != nil {
		return true, fmt.Errorf("durallm: action %s: decode memo %s: %w", d.ID, key, err)
	}
	return true, nil
}

// Describe returns the action's description (its latest run): one
// DescribeWorkflowExecution, no workflow task.
func (c *Client) Describe(ctx context.Context, id string) (Description, error) {
	resp, err := c.tc.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		return Description{}, mapNotFound(id, err)
	}
	info := resp.GetWorkflowExecutionInfo()
	d := Description{
		ID: id, RunID: info.GetExecution().GetRunId(),
		Running:   info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING,
		StartTime: info.GetStartTime().AsTime(),
		memo:      info.GetMemo(), dc: c.converter(),
	}
	if info.GetCloseTime() != nil {
		d.CloseTime = info.GetCloseTime().AsTime()
	}
	for _, pa := range resp.GetPendingActivities() {
		if pa.GetActivityType().GetName() != attempt.CallModel {
			continue
		}
		a := RunningAttempt{ActivityID: pa.GetActivityId(), Started: pa.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED || pa.GetState() == enumspb.PENDING_ACTIVITY_STATE_CANCEL_REQUESTED,
			StreamURL: attempt.StreamURLOf(pa.GetLastWorkerIdentity())}
		if pa.GetHeartbeatDetails() != nil {
			// A heartbeat that does not decode (another encoding,
			// another version) is no evidence: left out.
			_ = d.dc.FromPayloads(pa.GetHeartbeatDetails(), &a.Progress)
		}
		if a.StreamURL == "" {
			a.StreamURL = a.Progress.StreamURL
		}
		d.Attempts = append(d.Attempts, a)
	}
	return d, nil
}

// Status returns the action's state and attempt timeline, running or not.
func (c *Client) Status(ctx context.Context, id string) (workflows.Status, error) {
	var st workflows.Status
	v, err := c.tc.QueryWorkflow(ctx, id, "", workflows.QueryStatus)
	if err != nil {
		return st, mapNotFound(id, err)
	}
	if err := v.Get(&st); err != nil {
		return st, fmt.Errorf("durallm: decode status of %s: %w", id, err)
	}
	return st, nil
}

// List returns the ids of actions in a state, newest first, using the
// DurallmState search attribute (which the namespace must have
// registered). At most limit ids; limit ≤ 0 means 100.
func (c *Client) List(ctx context.Context, state workflows.State, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 100
	}
	q := fmt.Sprintf("WorkflowType = %q AND DurallmState = %q", workflows.WorkflowName, string(state))
	var ids []string
	var token []byte
	for len(ids) < limit {
		resp, err := c.tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: q, PageSize: int32(min(limit, 1000)), NextPageToken: token})
		if err != nil {
			return ids, fmt.Errorf("durallm: list %s actions: %w", state, err)
		}
		for _, e := range resp.GetExecutions() {
			ids = append(ids, e.GetExecution().GetWorkflowId())
		}
		token = resp.GetNextPageToken()
		if len(token) == 0 {
			break
		}
	}
	return ids[:min(len(ids), limit)], nil
}

func mapNotFound(id string, err error) error {
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return fmt.Errorf("%w: %s: %w", ErrNotFound, id, err)
	}
	return err
}

func mapUpdateErr(id string, err error) error {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return &ReconcileError{ActionRef: id, Reason: app.Type(), Message: app.Message()}
	}
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return fmt.Errorf("%w: %s: %w", ErrNotFound, id, err)
	}
	return fmt.Errorf("durallm: reconcile %s: %w", id, err)
}
