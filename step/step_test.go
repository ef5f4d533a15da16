package step_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/actiontest"
	"github.com/durallm/durallm/workflows"
)

// These tests run parent workflows that call step in the SDK's test
// environment, in virtual time, with the real LLMAction as the child and
// its attempts scripted by testsuite/actiontest.

const parentID = "parent-1"

func newEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *actiontest.Actions) {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: parentID})
	env.SetTestTimeout(30 * time.Second)
	return env, actiontest.Register(t, env)
}

func ask(text string, routes ...string) workflows.ActionInput {
	if len(routes) == 0 {
		routes = []string{"primary", "fallback"}
	}
	return workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", text)}},
		Routes:  routes,
		// Long enough for the verdicts below: an attempt a verdict allows
		// after the deadline is not made.
		Deadline: 6 * time.Hour,
	}
}

// outcome is what a test parent reports of one call.
type outcome struct {
	ActionID string                 `json:"action_id"`
	Text     string                 `json:"text,omitempty"`
	State    workflows.State        `json:"state,omitempty"`
	Origin   workflows.CancelOrigin `json:"origin,omitempty"`
	Err      string                 `json:"err,omitempty"`
	// What errors.Is/As found.
	Action     bool `json:"action,omitempty"`
	Awaiting   bool `json:"awaiting,omitempty"`
	Invalid    bool `json:"invalid,omitempty"`
	TooLarge   bool `json:"too_large,omitempty"`
	AwaitingOn int  `json:"awaiting_on,omitempty"`
	Attempts   int  `json:"attempts,omitempty"`
	Health     bool `json:"health,omitempty"`
	At         time.Duration
}

func describe(ctx workflow.Context, start time.Time, id string, res workflows.ActionResult, err error) outcome {
	o := outcome{ActionID: id, State: res.State, Origin: res.Origin, Attempts: len(res.Attempts), At: workflow.Now(ctx).Sub(start)}
	if res.Response != nil {
		o.Text = res.Response.Text
	}
	for _, a := range res.Attempts {
		o.Health = o.Health || a.HealthMoved
	}
	if err != nil {
		o.Err = err.Error()
	}
	var ae *durallm.ActionError
	if errors.As(err, &ae) {
		o.Action, o.State, o.Origin = true, ae.State, ae.Origin
	}
	var aw *durallm.AwaitingError
	if errors.As(err, &aw) && errors.Is(err, durallm.ErrAwaitingReconciliation) {
		o.Awaiting, o.AwaitingOn, o.ActionID = true, aw.Attempt, aw.ActionRef
	}
	o.Invalid = errors.Is(err, durallm.ErrInvalidInput)
	return o
}

// twoCalls asks twice, one call after the other.
func twoCalls(ctx workflow.Context) ([]outcome, error) {
	start := workflow.Now(ctx)
	var out []outcome
	for _, name := range []string{"ask", "again"} {
		f := step.StartCall(ctx, name, ask("hello"))
		res, err := f.Get(ctx)
		out = append(out, describe(ctx, start, f.ActionID(), res, err))
	}
	return out, nil
}

func run(t *testing.T, env *testsuite.TestWorkflowEnvironment, wf any, args ...any) []outcome {
	t.Helper()
	env.ExecuteWorkflow(wf, args...)
	if !env.IsWorkflowCompleted() {
		t.Fatal("parent did not complete")
	}
	if err := env.GetWorkflowError(); err != nil {
		t.Fatalf("parent failed: %v", err)
	}
	var out []outcome
	if err := env.GetWorkflowResult(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTwoCallsCompleteWithTheirTextsAndDeterministicIDs(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Answer("first answer"))
	actions.On("again", actiontest.Refused(), actiontest.Answer("second answer"))
	out := run(t, env, twoCalls)
	if len(out) != 2 || out[0].Text != "first answer" || out[1].Text != "second answer" || out[0].Err != "" || out[1].Err != "" {
		t.Fatalf("outcomes %+v", out)
	}
	if out[0].ActionID != "parent-1-ask" || out[1].ActionID != step.ActionID(parentID, "again") || out[1].Attempts != 2 {
		t.Fatalf("outcomes %+v", out)
	}
}

func TestAnEndOtherThanCompletedIsTheClientsActionError(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Rejected(400))
	actions.On("again", actiontest.Misdirected(), actiontest.Misdirected())
	out := run(t, env, twoCalls)
	if !out[0].Action || out[0].State != workflows.StateRejected || !out[1].Action || out[1].State != workflows.StateFailed {
		t.Fatalf("outcomes %+v", out)
	}
}

// invalidCalls makes calls LLMAction would reject.
func invalidCalls(ctx workflow.Context) ([]outcome, error) {
	start := workflow.Now(ctx)
	noRoutes := ask("hi")
	noRoutes.Routes = nil
	tooMany := ask("hi")
	tooMany.MaxAttempts = 99
	var out []outcome
	for _, c := range []struct {
		name string
		in   workflows.ActionInput
	}{{"no-routes", noRoutes}, {"", ask("hi")}, {"too-many", tooMany}} {
		res, err := step.Call(ctx, c.name, c.in)
		out = append(out, describe(ctx, start, c.name, res, err))
	}
	return out, nil
}

func TestAnInvalidInputStartsNothing(t *testing.T) {
	env, _ := newEnv(t)
	started := 0
	env.SetOnChildWorkflowStartedListener(func(*workflow.Info, workflow.Context, converter.EncodedValues) { started++ })
	out := run(t, env, invalidCalls)
	for _, o := range out {
		if !o.Invalid || o.Action {
			t.Fatalf("outcomes %+v", out)
		}
	}
	if started != 0 {
		t.Fatalf("%d actions started", started)
	}
}

// A parent canceled by its caller cancels the action: canceled by
// parent_canceled, no fallback attempt, health untouched, and the parent
// learns it.
func TestACanceledParentCancelsTheActionAsParentCanceled(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Hold())
	env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Second)
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		res, err := step.Call(ctx, "ask", ask("hi"))
		return []outcome{describe(ctx, start, "ask", res, err)}, nil
	})
	o := out[0]
	if !o.Action || o.State != workflows.StateCanceled || o.Origin != workflows.OriginParentCanceled || o.Attempts != 1 || o.Health {
		t.Fatalf("outcome %+v", o)
	}
}

// A parent canceled before it calls starts nothing.
func TestACallFromACanceledWorkflowStartsNothing(t *testing.T) {
	env, _ := newEnv(t)
	started := 0
	env.SetOnChildWorkflowStartedListener(func(*workflow.Info, workflow.Context, converter.EncodedValues) { started++ })
	env.RegisterDelayedCallback(env.CancelWorkflow, time.Second)
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		_ = workflow.Await(ctx, func() bool { return false }) // until canceled
		res, err := step.Call(ctx, "ask", ask("hi"))
		return []outcome{describe(ctx, start, "ask", res, err)}, nil
	})
	if out[0].Err == "" || out[0].Action || started != 0 {
		t.Fatalf("outcome %+v, %d started", out[0], started)
	}
}

// By default a call waits, durably, for the verdict like any action.
func TestACallWaitsForTheVerdictByDefault(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 2*time.Hour), actiontest.Answer("after the verdict"))
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		res, err := step.Call(ctx, "ask", ask("hi"))
		return []outcome{describe(ctx, start, "ask", res, err)}, nil
	})
	if o := out[0]; o.Err != "" || o.Text != "after the verdict" || o.Attempts != 2 || o.At < 2*time.Hour {
		t.Fatalf("outcome %+v", o)
	}
}

// awaitThenWait returns early from an ambiguous call, then waits for it
// with the same future.
func awaitThenWait(ctx workflow.Context, patience time.Duration) ([]outcome, error) {
	start := workflow.Now(ctx)
	f := step.StartCall(ctx, "ask", ask("hi"), step.ReturnIfAwaiting(patience))
	res, err := f.Get(ctx)
	out := []outcome{describe(ctx, start, f.ActionID(), res, err)}
	res, err = f.Get(ctx) // still awaiting: at once
	out = append(out, describe(ctx, start, f.ActionID(), res, err))
	_ = workflow.Await(ctx, f.Ended)
	res, err = f.Get(ctx)
	return append(out, describe(ctx, start, f.ActionID(), res, err)), nil
}

func TestReturnIfAwaitingGivesTheActionIDAndTheActionStaysResolvable(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 3*time.Hour), actiontest.Answer("resolved later"))
	out := run(t, env, awaitThenWait, 10*time.Minute)
	first, second, last := out[0], out[1], out[2]
	if !first.Awaiting || first.ActionID != "parent-1-ask" || first.AwaitingOn != 1 || first.Action || first.At < 10*time.Minute || first.At > 11*time.Minute {
		t.Fatalf("first %+v", first)
	}
	if !second.Awaiting || second.At != first.At {
		t.Fatalf("second %+v", second)
	}
	if last.Err != "" || last.Text != "resolved later" || last.At < 3*time.Hour {
		t.Fatalf("last %+v", last)
	}
}

// A verdict that arrives before the parent's patience runs out: no early
// return.
func TestAVerdictWithinThePatienceEndsTheCallNormally(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 5*time.Minute), actiontest.Ambiguous().ThenVerdict(attempt.VerdictAbandon, 5*time.Minute))
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		res, err := step.Call(ctx, "ask", ask("hi"), step.ReturnIfAwaiting(10*time.Minute))
		return []outcome{describe(ctx, start, "ask", res, err)}, nil
	})
	// Two waits of five minutes each: the patience restarts with each
	// attempt awaiting a verdict.
	if o := out[0]; o.Awaiting || !o.Action || o.State != workflows.StateIndeterminate || o.Attempts != 2 {
		t.Fatalf("outcome %+v", o)
	}
}

// A call outlives the run that made it: one the parent returned early
// from is resolved by a verdict after the parent ended, and an ordinary
// one runs to its end, for a later run of the parent to collect (a
// retry, Continue-As-New). The action settles its own attempts either
// way.
func TestWhatAParentLeavesBehindWhenItEnds(t *testing.T) {
	t.Run("returned early: the action outlives the parent", func(t *testing.T) {
		env, actions := newEnv(t)
		actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, time.Hour), actiontest.Answer("resolved after the parent ended"))
		out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
			start := workflow.Now(ctx)
			res, err := step.Call(ctx, "ask", ask("hi"), step.ReturnIfAwaiting(time.Minute))
			return []outcome{describe(ctx, start, "ask", res, err)}, nil
		})
		if !out[0].Awaiting {
			t.Fatalf("outcome %+v", out[0])
		}
		if st := statusOf(t, env, "parent-1-ask"); st.State != workflows.StateCompleted || st.Used != 2 {
			t.Fatalf("the action after its parent: %+v", st)
		}
	})
	t.Run("an ordinary call: it runs to its end", func(t *testing.T) {
		env, actions := newEnv(t)
		actions.On("ask", actiontest.Answer("after the parent ended").Taking(time.Hour))
		run(t, env, func(ctx workflow.Context) ([]outcome, error) {
			f := step.StartCall(ctx, "ask", ask("hi"))
			_ = workflow.Sleep(ctx, 10*time.Second) // and ends without waiting for it
			return []outcome{{ActionID: f.ActionID()}}, nil
		})
		if st := statusOf(t, env, "parent-1-ask"); st.State != workflows.StateCompleted || st.Used != 1 {
			t.Fatalf("the action after its parent: %s %s", st.State, st.Origin)
		}
	})
}

// statusOf queries an action after the test (GetWorkflowResultByID
// returns the parent's result, and a child that ends after its parent
// reports to no listener).
func statusOf(t *testing.T, env *testsuite.TestWorkflowEnvironment, id string) workflows.Status {
	t.Helper()
	v, err := env.QueryWorkflowByID(id, workflows.QueryStatus)
	var st workflows.Status
	if err == nil {
		err = v.Get(&st)
	}
	if err != nil {
		t.Fatalf("status of %s: %v", id, err)
	}
	return st
}

func TestTaskQueueOption(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Answer("elsewhere"))
	var queue string
	env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, _ converter.EncodedValues) { queue = info.TaskQueueName })
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		res, err := step.Call(ctx, "ask", ask("hi"), step.TaskQueue("llm-eu"))
		return []outcome{describe(ctx, start, "ask", res, err)}, nil
	})
	if out[0].Text != "elsewhere" || queue != "llm-eu" {
		t.Fatalf("outcome %+v on queue %q", out[0], queue)
	}
}

// A parent canceled while its call awaits a verdict, with its patience
// not yet spent: the action is canceled (parent_canceled) and Get returns
// that end, not an early return.
func TestACanceledParentWhileAwaitingGetsTheCancellation(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Ambiguous())
	env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Minute)
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		res, err := step.Call(ctx, "ask", ask("hi"), step.ReturnIfAwaiting(time.Hour))
		return []outcome{describe(ctx, start, "ask", res, err)}, nil
	})
	if o := out[0]; o.Awaiting || !o.Action || o.State != workflows.StateCanceled || o.Origin != workflows.OriginParentCanceled || o.At < 10*time.Minute || o.At > 11*time.Minute {
		t.Fatalf("outcome %+v", o)
	}
}
