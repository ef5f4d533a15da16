package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// A call's identity outlives its parent's runs: a later run of the same
// workflow (a retry, a reset, Continue-As-New) that makes the call again
// gets the action the first one started, ended or running, executed
// once; a new workflow under a closed one's id makes a call of its own.
// Each parent runs on the user's own worker, each call on the durallm
// worker, against the fault-injecting provider, which counts what it
// executed.

// callIn is the input of the parents below.
type callIn struct {
	Input     workflows.ActionInput `json:"input"`
	TaskQueue string                `json:"task_queue"`
	// Continued is set in the run a Continue-As-New starts.
	Continued bool `json:"continued,omitempty"`
}

func (s *stack) callIn() callIn { return callIn{Input: actionInput(false), TaskQueue: s.tq} }

func registerIdentityParents(w sdkworker.Registry) {
	for _, wf := range []any{planThenFailOnce, planThenWait, planOnce, planTwice, planAcrossContinueAsNew, earlyReturnThenCanceled, patientThenFailOnce, attachTo, planTwiceAtOnce} {
		w.RegisterWorkflow(wf)
	}
}

// planThenFailOnce makes its "plan" call, then fails on its first
// attempt: its RetryPolicy runs it again.
func planThenFailOnce(ctx workflow.Context, in callIn) (string, error) {
	res, err := step.Call(ctx, "plan", in.Input, step.TaskQueue(in.TaskQueue))
	if err != nil {
		return "", err
	}
	if workflow.GetInfo(ctx).Attempt == 1 {
		return "", temporal.NewApplicationError("the first run fails after its call", "Planned")
	}
	return res.Response.Text, nil
}

// planThenWait makes its "plan" call, then waits for the "finish"
// signal (time for a reset) and returns the call's text.
func planThenWait(ctx workflow.Context, in callIn) (string, error) {
	res, err := step.Call(ctx, "plan", in.Input, step.TaskQueue(in.TaskQueue))
	if err != nil {
		return "", err
	}
	workflow.GetSignalChannel(ctx, "finish").Receive(ctx, nil)
	return res.Response.Text, nil
}

// planOnce makes its "plan" call and returns its action id and text.
func planOnce(ctx workflow.Context, in callIn) (string, error) {
	f := step.StartCall(ctx, "plan", in.Input, step.TaskQueue(in.TaskQueue))
	res, err := f.Get(ctx)
	if err != nil {
		return "", err
	}
	return f.ActionID() + " " + res.Response.Text, nil
}

// planTwice makes the same call twice.
func planTwice(ctx workflow.Context, in callIn) ([]string, error) {
	var out []string
	for range 2 {
		res, err := step.Call(ctx, "plan", in.Input, step.TaskQueue(in.TaskQueue))
		if err != nil {
			return out, err
		}
		out = append(out, res.Response.Text)
	}
	return out, nil
}

// planTwiceAtOnce starts the same call twice in one go, then waits for
// both.
func planTwiceAtOnce(ctx workflow.Context, in callIn) ([]string, error) {
	fs := []*step.Future{
		step.StartCall(ctx, "plan", in.Input, step.TaskQueue(in.TaskQueue)),
		step.StartCall(ctx, "plan", in.Input, step.TaskQueue(in.TaskQueue)),
	}
	var out []string
	for _, f := range fs {
		res, err := f.Get(ctx)
		if err != nil {
			return out, err
		}
		out = append(out, res.Response.Text)
	}
	return out, nil
}

// planAcrossContinueAsNew starts its "plan" call and continues as new
// without waiting for it; the next run makes the call again.
func planAcrossContinueAsNew(ctx workflow.Context, in callIn) (string, error) {
	f := step.StartCall(ctx, "plan", in.Input, step.TaskQueue(in.TaskQueue))
	if !in.Continued {
		// The call has started before the run ends.
		if err := workflow.Sleep(ctx, time.Second); err != nil {
			return "", err
		}
		in.Continued = true
		return "", workflow.NewContinueAsNewError(ctx, planAcrossContinueAsNew, in)
	}
	res, err := f.Get(ctx)
	if err != nil {
		return "", err
	}
	return res.Response.Text, nil
}

// earlyReturnThenCanceled returns early from an ambiguous call, then
// waits to be canceled, and cleans up after the cancel as a workflow
// does. Its "phase" query says where it is.
func earlyReturnThenCanceled(ctx workflow.Context, in callIn) (string, error) {
	phase := "calling"
	if err := workflow.SetQueryHandler(ctx, "phase", func() (string, error) { return phase, nil }); err != nil {
		return "", err
	}
	_, err := step.Call(ctx, "ask", in.Input, step.ReturnIfAwaiting(time.Second), step.TaskQueue(in.TaskQueue))
	if !errors.Is(err, durallm.ErrAwaitingReconciliation) {
		return "", fmt.Errorf("want an early return, got %w", err)
	}
	phase = "returned early"
	_ = workflow.Await(ctx, func() bool { return false }) // until canceled
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	_ = workflow.Sleep(dctx, time.Second)
	return "", ctx.Err()
}

// patientThenFailOnce returns early from an ambiguous call, then fails
// on its first attempt; its retry makes the call again and reports what
// it got.
func patientThenFailOnce(ctx workflow.Context, in callIn) (string, error) {
	_, err := step.Call(ctx, "ask", in.Input, step.ReturnIfAwaiting(time.Second), step.TaskQueue(in.TaskQueue))
	var aw *durallm.AwaitingError
	if !errors.As(err, &aw) {
		return "", fmt.Errorf("want an early return, got %w", err)
	}
	if workflow.GetInfo(ctx).Attempt == 1 {
		return "", temporal.NewApplicationError("the first run fails after its call", "Planned")
	}
	return fmt.Sprintf("awaiting %s attempt %d", aw.ActionRef, aw.Attempt), nil
}

// attachIn is attachTo's input.
type attachIn struct {
	ActionID  string `json:"action_id"`
	TaskQueue string `json:"task_queue"`
}

// attachTo waits for an action it did not start, by its id.
func attachTo(ctx workflow.Context, in attachIn) (string, error) {
	f := step.Attach(ctx, in.ActionID, step.TaskQueue(in.TaskQueue))
	var we workflow.Execution
	err := f.Started().Get(ctx, &we)
	if errors.Is(err, durallm.ErrNotFound) {
		return "not found", nil
	}
	if err != nil || we.ID != in.ActionID || we.RunID == "" {
		return "", fmt.Errorf("started %+v: %w", we, err)
	}
	res, err := f.Get(ctx)
	if err != nil {
		return "", err
	}
	return res.Response.Text, nil
}

func result[T any](t *testing.T, run client.WorkflowRun) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out T
	if err := run.Get(ctx, &out); err != nil {
		t.Fatalf("parent %s: %v", run.GetID(), err)
	}
	return out
}

// A parent with a RetryPolicy that fails after its first call completes
// on its retry, which gets the call's result: the provider ran it once.
func TestE2EStepARetriedParentGetsItsFirstCall(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.Answer("the plan"))
	run, err := s.tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{
		ID: "retried", TaskQueue: q,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaximumAttempts: 2},
	}, planThenFailOnce, s.callIn())
	if err != nil {
		t.Fatal(err)
	}
	if got := result[string](t, run); got != "the plan" {
		t.Fatalf("parent: %q", got)
	}
	if n := s.p.ExecutedCount("retried-plan"); n != 1 || len(s.p.Received()) != 1 {
		t.Fatalf("executed %d, received %d", n, len(s.p.Received()))
	}
	s.saveHistoryAt("retried", filepath.Join("testdata", "step_retried.json"))
}

// resetTo resets workflow id's current run to its first workflow task
// (first), as `temporal workflow reset --type FirstWorkflowTask` does, or
// to its last (`LastWorkflowTask`), and returns the new run's id.
func (s *stack) resetTo(id string, first bool) string {
	s.t.Helper()
	ctx := context.Background()
	var point int64
	iter := s.tc.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() && !(first && point != 0) {
		ev, err := iter.Next()
		if err != nil {
			s.t.Fatal(err)
		}
		if ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			point = ev.GetEventId()
		}
	}
	resp, err := s.tc.ResetWorkflowExecution(ctx, &workflowservice.ResetWorkflowExecutionRequest{
		Namespace:                 s.ts.GetDefaultNamespace(),
		WorkflowExecution:         &commonpb.WorkflowExecution{WorkflowId: id},
		Reason:                    "test",
		WorkflowTaskFinishEventId: point,
		RequestId:                 uuid.NewString(),
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return resp.GetRunId()
}

// A parent reset after its call completed gets the call's result,
// executed once: reset to a point after the call (its end is in the new
// run's history), then, once that run completed, to its start (the new
// run makes the call again and reaches it).
func TestE2EStepAParentResetAfterItsCallCompletedGetsIt(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.Answer("the plan"))
	s.startParent("reset-after", q, planThenWait, s.callIn())
	s.waitState("reset-after-plan", workflows.StateCompleted)
	for _, first := range []bool{false, true} {
		runID := s.resetTo("reset-after", first)
		if err := s.tc.SignalWorkflow(context.Background(), "reset-after", runID, "finish", nil); err != nil {
			t.Fatal(err)
		}
		if got := result[string](t, s.tc.GetWorkflow(context.Background(), "reset-after", runID)); got != "the plan" {
			t.Fatalf("parent reset to its first task %v: %q", first, got)
		}
		// Reset to its start, the run reached the call it had made.
		if s.scheduled("reset-after", runID, workflows.DescribeCall) != first {
			t.Fatalf("parent reset to its first task %v: DescribeCall scheduled %v", first, !first)
		}
	}
	if n := s.p.ExecutedCount("reset-after-plan"); n != 1 || len(s.p.Received()) != 1 {
		t.Fatalf("executed %d, received %d", n, len(s.p.Received()))
	}
}

// A parent reset to its start while its call runs attaches to the call
// and gets its result when it ends: executed once.
func TestE2EStepAParentResetWhileItsCallRunsAttachesToIt(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	release := make(chan struct{})
	s.p.Push(providertest.Answer("the plan").WaitFor(release))
	s.startParent("reset-during", q, planThenWait, s.callIn())
	waitFor(t, func() bool { return len(s.p.Received()) == 1 })
	runID := s.resetTo("reset-during", true)
	waitFor(t, func() bool { return s.scheduled("reset-during", runID, workflows.AwaitCall) })
	close(release)
	if err := s.tc.SignalWorkflow(context.Background(), "reset-during", runID, "finish", nil); err != nil {
		t.Fatal(err)
	}
	if got := result[string](t, s.tc.GetWorkflow(context.Background(), "reset-during", runID)); got != "the plan" {
		t.Fatalf("parent: %q", got)
	}
	if n := s.p.ExecutedCount("reset-during-plan"); n != 1 || len(s.p.Received()) != 1 {
		t.Fatalf("executed %d, received %d", n, len(s.p.Received()))
	}
}

// A run that continued as new while its call ran makes the call again
// and waits for it: the call was not canceled by the run's end.
func TestE2EStepARunAfterContinueAsNewGetsTheCallStartedBefore(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	release := make(chan struct{})
	s.p.Push(providertest.Answer("the plan").WaitFor(release))
	run := s.startParent("continued", q, planAcrossContinueAsNew, s.callIn())
	waitFor(t, func() bool {
		d, err := s.tc.DescribeWorkflowExecution(context.Background(), "continued", "")
		later := d.GetWorkflowExecutionInfo().GetExecution().GetRunId()
		return err == nil && later != run.GetRunID() && s.scheduled("continued", later, workflows.AwaitCall)
	})
	close(release)
	if got := result[string](t, s.tc.GetWorkflow(context.Background(), "continued", "")); got != "the plan" {
		t.Fatalf("parent: %q", got)
	}
	if n := s.p.ExecutedCount("continued-plan"); n != 1 || len(s.p.Received()) != 1 {
		t.Fatalf("executed %d, received %d", n, len(s.p.Received()))
	}
}

// The same name twice in one run is the same call: one after the other,
// or both at once (the second start refused by the SDK itself while the
// first is on its way).
func TestE2EStepTheSameNameTwiceIsTheSameCall(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	for _, wf := range []any{planTwice, planTwiceAtOnce} {
		id := fmt.Sprintf("twice-%d", len(s.p.Received()))
		s.p.Push(providertest.Answer("the plan"))
		got := result[[]string](t, s.startParent(id, q, wf, s.callIn()))
		if len(got) != 2 || got[0] != "the plan" || got[1] != "the plan" {
			t.Fatalf("%s: %q", id, got)
		}
		if n := s.p.ExecutedCount(id + "-plan"); n != 1 {
			t.Fatalf("%s: executed %d", id, n)
		}
	}
	if n := len(s.p.Received()); n != 2 {
		t.Fatalf("received %d", n)
	}
}

// A new workflow started under the id of a closed one (Temporal's
// default reuse policy) is another workflow: its call is a call of its
// own, under an id that names its run chain, executed once too.
func TestE2EStepANewWorkflowUnderAClosedOnesIDMakesItsOwnCall(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.Answer("the first plan"), providertest.Answer("the second plan"))
	if got := result[string](t, s.startParent("reused", q, planOnce, s.callIn())); got != "reused-plan the first plan" {
		t.Fatalf("first: %q", got)
	}
	second := s.startParent("reused", q, planOnce, s.callIn())
	want := step.ActionID("reused", "plan") + "@" + second.GetRunID()
	if got := result[string](t, second); got != want+" the second plan" {
		t.Fatalf("second: %q, want %q", got, want+" the second plan")
	}
	if s.p.ExecutedCount("reused-plan") != 1 || s.p.ExecutedCount(want) != 1 || len(s.p.Received()) != 2 {
		t.Fatalf("executed %v", s.p.Processed())
	}
}

// A parent canceled after ReturnIfAwaiting returned, and cleaning up,
// leaves the action awaiting its verdict; the verdict still applies.
func TestE2EStepACanceledParentAfterAnEarlyReturnLeavesTheActionToItsVerdict(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo), providertest.Answer("after the verdict"))
	run := s.startParent("abandoning", q, earlyReturnThenCanceled, s.callIn())
	waitFor(t, func() bool {
		v, err := s.tc.QueryWorkflow(context.Background(), "abandoning", "", "phase")
		var phase string
		return err == nil && v.Get(&phase) == nil && phase == "returned early"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.tc.CancelWorkflow(ctx, "abandoning", ""); err != nil {
		t.Fatal(err)
	}
	var canceled *temporal.CanceledError
	if err := run.Get(ctx, nil); !errors.As(err, &canceled) {
		t.Fatalf("the parent ended with %v", err)
	}
	if st, err := s.c.Status(ctx, "abandoning-ask"); err != nil || st.State != workflows.StateAwaitingReconciliation || st.AwaitingAttempt != 1 {
		t.Fatalf("the action after its parent: %s %v", st.State, err)
	}
	if err := s.c.Reconcile(ctx, "abandoning-ask", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictNotExecuted, By: "test"}); err != nil {
		t.Fatal(err)
	}
	res, err := s.c.Get("abandoning-ask").Result(ctx)
	if err != nil || res.State != workflows.StateCompleted || res.Response.Text != "after the verdict" || res.Used != 2 {
		t.Fatalf("action: %s %+v %v", res.State, res.Response, err)
	}
}

// scheduled reports whether run runID of workflow id scheduled an
// activity of type name.
func (s *stack) scheduled(id, runID, name string) bool {
	return len(s.events(id, runID, func(ev *historypb.HistoryEvent) bool {
		return ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() == name
	})) > 0
}

// events lists the events of run runID of workflow id that match.
func (s *stack) events(id, runID string, match func(*historypb.HistoryEvent) bool) []*historypb.HistoryEvent {
	s.t.Helper()
	var out []*historypb.HistoryEvent
	iter := s.tc.GetWorkflowHistory(context.Background(), id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			return nil
		}
		if match(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// A later run whose call awaits a verdict learns it at once: the
// action has awaited it longer than the run's patience, counted from
// when the wait began, before the run began.
func TestE2EStepARetriedParentLearnsAtOnceThatItsCallAwaitsAVerdict(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo), providertest.Answer("after the verdict"))
	run, err := s.tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{
		ID: "patient-retried", TaskQueue: q,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaximumAttempts: 2},
	}, patientThenFailOnce, s.callIn())
	if err != nil {
		t.Fatal(err)
	}
	if got := result[string](t, run); got != "awaiting patient-retried-ask attempt 1" {
		t.Fatalf("parent: %q", got)
	}
	ctx := context.Background()
	// The retry started no timer for its patience: spent before it began.
	d, err := s.tc.DescribeWorkflowExecution(ctx, "patient-retried", "")
	if err != nil {
		t.Fatal(err)
	}
	timers := s.events("patient-retried", d.GetWorkflowExecutionInfo().GetExecution().GetRunId(), func(ev *historypb.HistoryEvent) bool {
		return ev.GetEventType() == enumspb.EVENT_TYPE_TIMER_STARTED
	})
	if st, err := s.c.Status(ctx, "patient-retried-ask"); err != nil || st.AwaitingSince.IsZero() || len(timers) != 0 {
		t.Fatalf("status %+v %v; the retry started %d timers", st, err, len(timers))
	}
	if err := s.c.Reconcile(ctx, "patient-retried-ask", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictNotExecuted, By: "test"}); err != nil {
		t.Fatal(err)
	}
	res, err := s.c.Get("patient-retried-ask").Result(ctx)
	if err != nil || res.Response.Text != "after the verdict" || res.Used != 2 || len(s.p.Received()) != 2 {
		t.Fatalf("action: %s %v, received %d", res.State, err, len(s.p.Received()))
	}
}

// Attach waits for a call another workflow made, by its id, and its
// Started gives the action's run; an id no action has is ErrNotFound.
func TestE2EStepAttachWaitsForAnotherWorkflowsCall(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	release := make(chan struct{})
	s.p.Push(providertest.Answer("the plan").WaitFor(release))
	s.startParent("owner", q, planThenWait, s.callIn())
	waitFor(t, func() bool { return len(s.p.Received()) == 1 })
	watcher := s.startParent("watcher", q, attachTo, attachIn{ActionID: "owner-plan", TaskQueue: s.tq})
	waitFor(t, func() bool { return s.scheduled("watcher", "", workflows.AwaitCall) })
	close(release)
	if got := result[string](t, watcher); got != "the plan" {
		t.Fatalf("watcher: %q", got)
	}
	if got := result[string](t, s.startParent("lost", q, attachTo, attachIn{ActionID: "no-such-action", TaskQueue: s.tq})); got != "not found" {
		t.Fatalf("attach to nothing: %q", got)
	}
	if n := s.p.ExecutedCount("owner-plan"); n != 1 || len(s.p.Received()) != 1 {
		t.Fatalf("executed %d, received %d", n, len(s.p.Received()))
	}
}

// A later run canceled while it waits for the call an earlier run
// started cancels the call, as the earlier run's cancellation would
// have: it ends canceled by parent_canceled, and the run learns it.
func TestE2EStepACanceledLaterRunCancelsTheCallItWaitsFor(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.Hold())
	first := s.startParent("continued-canceled", q, planAcrossContinueAsNew, s.callIn())
	var later string
	waitFor(t, func() bool {
		d, err := s.tc.DescribeWorkflowExecution(context.Background(), "continued-canceled", "")
		later = d.GetWorkflowExecutionInfo().GetExecution().GetRunId()
		return err == nil && later != first.GetRunID() && s.scheduled("continued-canceled", later, workflows.AwaitCall)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.tc.CancelWorkflow(ctx, "continued-canceled", ""); err != nil {
		t.Fatal(err)
	}
	err := s.tc.GetWorkflow(ctx, "continued-canceled", later).Get(ctx, nil)
	if err == nil {
		t.Fatal("the later run ended without an error")
	}
	_, err = s.c.Get("continued-canceled-plan").Result(ctx)
	var ae *durallm.ActionError
	if !errors.As(err, &ae) || ae.State != workflows.StateCanceled || ae.Origin != workflows.OriginParentCanceled {
		t.Fatalf("the action ended with %v", err)
	}
	if len(s.p.Received()) != 1 {
		t.Fatalf("received %d", len(s.p.Received()))
	}
}

// The runs of a cron schedule are one workflow: a call of a name an
// earlier run made is that call, executed once (a run that should call
// anew names the call after what makes it new).
func TestE2EStepTheNextCronRunGetsTheCallOfTheFirst(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.Answer("the plan"))
	ctx := context.Background()
	if _, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "cron", TaskQueue: q, CronSchedule: "@every 1s"}, planOnce, s.callIn()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.tc.TerminateWorkflow(ctx, "cron", "", "test over") }()
	// Until two runs after the first have reached the first's call and
	// ended.
	waitFor(t, func() bool {
		resp, err := s.tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: "WorkflowId = 'cron' AND ExecutionStatus != 'Running'"})
		if err != nil {
			return false
		}
		reached := 0
		for _, e := range resp.GetExecutions() {
			if s.scheduled("cron", e.GetExecution().GetRunId(), workflows.DescribeCall) {
				reached++
			}
		}
		return reached >= 2
	})
	if n := s.p.ExecutedCount("cron-plan"); n != 1 || len(s.p.Received()) != 1 {
		t.Fatalf("executed %d, received %d", n, len(s.p.Received()))
	}
}
