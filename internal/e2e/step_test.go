package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/examples/agent"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// A workflow of the user's own calling durallm with package step, on the
// embedded server: the parent on its own task queue and worker, each
// call an LLMAction on the durallm worker's, against the fault-injecting
// provider. The parent is the example agent (examples/agent): ask, run
// the tool, ask again.

// parents starts a worker of the user's own for the parent workflows, on
// a task queue of the stack's, and returns the queue.
func (s *stack) parents() string {
	s.t.Helper()
	q := s.tq + "-parents"
	w := sdkworker.New(s.tc, q, sdkworker.Options{})
	registerParents(w)
	if err := w.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(w.Stop)
	return q
}

func registerParents(w sdkworker.Registry) {
	w.RegisterWorkflow(agent.Agent)
	w.RegisterActivity(&agent.Activities{})
	w.RegisterWorkflow(patientParent)
	registerIdentityParents(w)
}

func (s *stack) agentInput(stream bool) agent.Input {
	return agent.Input{Question: "Where is order 42?", Routes: []string{"primary", "fallback"}, Stream: stream, DurallmTaskQueue: s.tq}
}

func (s *stack) startParent(id, queue string, wf any, arg any) client.WorkflowRun {
	s.t.Helper()
	run, err := s.tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: id, TaskQueue: queue}, wf, arg)
	if err != nil {
		s.t.Fatal(err)
	}
	return run
}

func getOutput(t *testing.T, run client.WorkflowRun) agent.Output {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out agent.Output
	if err := run.Get(ctx, &out); err != nil {
		t.Fatalf("agent: %v", err)
	}
	return out
}

// Two calls and a tool activity complete; each request is executed once;
// the history is what examples/agent's replay test replays.
func TestE2EStepTwoCallsAndAToolActivityComplete(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.AnswerToolCall("lookup_order", `{"order_id":"42"}`), providertest.Answer("Order 42 arrives Thursday."))
	out := getOutput(t, s.startParent("agent-e2e", q, agent.Agent, s.agentInput(false)))
	if out.Answer != "Order 42 arrives Thursday." || out.Tool != "lookup_order" || out.ToolResult != "order 42: shipped on Monday, arriving Thursday" {
		t.Fatalf("output %+v", out)
	}
	for _, id := range []string{"agent-e2e-ask", "agent-e2e-answer"} {
		if n := s.p.ExecutedCount(id); n != 1 {
			t.Fatalf("%s executed %d times", id, n)
		}
		if st, err := s.c.Status(context.Background(), id); err != nil || st.State != workflows.StateCompleted {
			t.Fatalf("%s: %s %v", id, st.State, err)
		}
	}
	s.saveHistoryAt("agent-e2e", filepath.Join("..", "..", "examples", "agent", "testdata", "agent.json"))
}

// The parent's worker is SIGKILLed while its first call is in flight; a
// new worker replays the parent, finds the same action in its history and
// waits for it: no second action, each request executed once.
func TestE2EStepParentRestartedMidCallFindsTheSameAction(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a worker process")
	}
	s := newStack(t)
	s.startWorker()
	release := make(chan struct{})
	s.p.Push(providertest.AnswerToolCall("lookup_order", `{"order_id":"42"}`).WaitFor(release), providertest.Answer("Thursday."))
	q := s.tq + "-parents"
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperParentWorkerProcess$")
	cmd.Env = append(os.Environ(), "DURALLM_HELPER_PARENT=1",
		"DURALLM_HELPER_TEMPORAL="+s.ts.GetFrontendHostPort(), "DURALLM_HELPER_NAMESPACE="+s.ts.GetDefaultNamespace(), "DURALLM_HELPER_QUEUE="+q)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	run := s.startParent("agent-restarted", q, agent.Agent, s.agentInput(false))
	waitFor(t, func() bool { return s.p.ExecutedCount("agent-restarted-ask") == 1 })
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	w := sdkworker.New(s.tc, q, sdkworker.Options{})
	registerParents(w)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	close(release)
	out := getOutput(t, run)
	if out.Answer != "Thursday." || len(out.Actions) != 2 || out.Actions[0] != "agent-restarted-ask" {
		t.Fatalf("output %+v", out)
	}
	if n := len(s.p.Received()); n != 2 || s.p.ExecutedCount("agent-restarted-ask") != 1 || s.p.ExecutedCount("agent-restarted-answer") != 1 {
		t.Fatalf("provider received %d requests, executed %v", n, s.p.Processed())
	}
	// One action per call: the parent's history started each child once.
	children := 0
	iter := s.tc.GetWorkflowHistory(context.Background(), "agent-restarted", "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetEventType() == enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED {
			children++
		}
	}
	if children != 2 {
		t.Fatalf("the parent started %d actions", children)
	}
}

// TestHelperParentWorkerProcess is the parent's worker the restart test
// starts and kills. It does nothing in a normal run.
func TestHelperParentWorkerProcess(t *testing.T) {
	if os.Getenv("DURALLM_HELPER_PARENT") != "1" {
		t.Skip("helper process for TestE2EStepParentRestartedMidCallFindsTheSameAction")
	}
	tc, err := client.Dial(client.Options{HostPort: os.Getenv("DURALLM_HELPER_TEMPORAL"), Namespace: os.Getenv("DURALLM_HELPER_NAMESPACE"), Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	w := sdkworker.New(tc, os.Getenv("DURALLM_HELPER_QUEUE"), sdkworker.Options{})
	registerParents(w)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	select {} // until killed
}

// A parent canceled while its call streams: the action ends canceled by
// parent_canceled, one attempt, no fallback, health untouched; the parent
// ends canceled.
func TestE2EStepCanceledParentMidStreamCancelsTheAction(t *testing.T) {
	s := newStack(t)
	w := s.startWorker()
	q := s.parents()
	hold := make(chan struct{})
	defer close(hold)
	s.p.Push(providertest.AnswerToolCall("lookup_order", `{"order_id":"42"}`), providertest.Answer("Order 42 arrives on Thursday").MidStreamWaitFor(hold))
	events, stop := w.Streams().Subscribe("agent-canceled-answer", 64)
	defer stop()
	run := s.startParent("agent-canceled", q, agent.Agent, s.agentInput(true))
	if ev := <-events; ev.Delta == "" {
		t.Fatalf("first event %+v", ev)
	}
	if err := s.tc.CancelWorkflow(context.Background(), "agent-canceled", ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out agent.Output
	err := run.Get(ctx, &out)
	// The parent learned how its call ended before it ended itself (the
	// agent passes it on as the cancellation's details).
	var canceled *temporal.CanceledError
	var why string
	if !errors.As(err, &canceled) || canceled.Details(&why) != nil || why != "the answer call ended canceled (parent_canceled)" {
		t.Fatalf("the parent ended with %v (%q)", err, why)
	}
	_, err = s.c.Get("agent-canceled-answer").Result(ctx)
	var ae *durallm.ActionError
	if !errors.As(err, &ae) || ae.State != workflows.StateCanceled || ae.Origin != workflows.OriginParentCanceled {
		t.Fatalf("the action ended with %v", err)
	}
	if a := ae.Result.Attempts; len(a) != 1 || a[0].Classification.Class != evidence.Canceled || a[0].HealthMoved || !a[0].Evidence.ContentStarted {
		t.Fatalf("attempts %+v", a)
	}
	if n := s.p.ExecutedCount("agent-canceled-answer"); n != 1 || len(s.p.Received()) != 2 {
		t.Fatalf("executed %d, received %d", n, len(s.p.Received()))
	}
}

// patientCall is patientParent's input.
type patientCall struct {
	Input     workflows.ActionInput `json:"input"`
	TaskQueue string                `json:"task_queue"`
}

// patientParent makes one call that returns early while it awaits a
// verdict, and reports what it got.
func patientParent(ctx workflow.Context, in patientCall) (string, error) {
	_, err := step.Call(ctx, "ask", in.Input, step.ReturnIfAwaiting(2*time.Second), step.TaskQueue(in.TaskQueue))
	var aw *durallm.AwaitingError
	if errors.As(err, &aw) {
		return fmt.Sprintf("awaiting %s attempt %d", aw.ActionRef, aw.Attempt), nil
	}
	return "", fmt.Errorf("want an early return, got %w", err)
}

// An ambiguous call with the early return: the parent gets
// ErrAwaitingReconciliation naming the action and ends; the action outlives
// it, and a verdict by Update completes it.
func TestE2EStepEarlyReturnThenAVerdictByUpdate(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo), providertest.Answer("after the verdict"))
	run := s.startParent("patient", q, patientParent, patientCall{Input: actionInput(false), TaskQueue: s.tq})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got string
	if err := run.Get(ctx, &got); err != nil || got != "awaiting patient-ask attempt 1" {
		t.Fatalf("parent: %q %v", got, err)
	}
	if st := s.waitState("patient-ask", workflows.StateAwaitingReconciliation); st.AwaitingAttempt != 1 {
		t.Fatalf("status %+v", st)
	}
	if err := s.c.Reconcile(ctx, "patient-ask", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictNotExecuted, By: "test"}); err != nil {
		t.Fatal(err)
	}
	res, err := s.c.Get("patient-ask").Result(ctx)
	if err != nil || res.State != workflows.StateCompleted || res.Response.Text != "after the verdict" || res.Used != 2 {
		t.Fatalf("action: %s %+v %v", res.State, res.Response, err)
	}
	s.saveHistoryAt("patient", filepath.Join("testdata", "step_early_return.json"))
}
