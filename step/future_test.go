package step_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/actiontest"
	"github.com/durallm/durallm/workflows"
)

// The patience of ReturnIfAwaiting runs from when the action began to
// await its verdict, not from when the workflow called Get: a workflow
// busy for an hour learns at once that the call has awaited a verdict
// for its ten minutes.
func TestReturnIfAwaitingCountsFromWhenTheWaitBegan(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 6*time.Hour), actiontest.Answer("late"))
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		f := step.StartCall(ctx, "ask", ask("hi"), step.ReturnIfAwaiting(10*time.Minute))
		_ = workflow.Sleep(ctx, time.Hour) // busy elsewhere
		res, err := f.Get(ctx)
		return []outcome{describe(ctx, start, f.ActionID(), res, err)}, nil
	})
	if o := out[0]; !o.Awaiting || o.AwaitingOn != 1 || o.At != time.Hour {
		t.Fatalf("outcome %+v, want an early return at 1h", o)
	}
}

// A second Get, after the action has moved on to another attempt that
// awaits a verdict in its turn, names the attempt it awaits now, and a
// verdict built from it applies.
func TestASecondGetNamesTheAttemptAwaitingNow(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, time.Hour), actiontest.Ambiguous(), actiontest.Answer("after the parent's verdict"))
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		f := step.StartCall(ctx, "ask", ask("hi"), step.ReturnIfAwaiting(10*time.Minute))
		res, err := f.Get(ctx)
		out := []outcome{describe(ctx, start, f.ActionID(), res, err)}
		_ = workflow.Sleep(ctx, 3*time.Hour)
		res, err = f.Get(ctx)
		out = append(out, describe(ctx, start, f.ActionID(), res, err))
		var aw *durallm.AwaitingError
		if errors.As(err, &aw) {
			// The workflow decides: the attempt did not run.
			v := workflows.ReconcileRequest{Attempt: aw.Attempt, Verdict: attempt.VerdictNotExecuted, By: "parent"}
			if err := workflow.SignalExternalWorkflow(ctx, aw.ActionRef, "", workflows.SignalReconcile, v).Get(ctx, nil); err != nil {
				return nil, err
			}
		}
		for !f.IsReady() || errors.Is(err, durallm.ErrAwaitingReconciliation) {
			res, err = f.Get(ctx)
			if errors.Is(err, durallm.ErrAwaitingReconciliation) {
				_ = workflow.Sleep(ctx, time.Minute)
			}
		}
		return append(out, describe(ctx, start, f.ActionID(), res, err)), nil
	})
	first, second, last := out[0], out[1], out[2]
	if !first.Awaiting || first.AwaitingOn != 1 {
		t.Fatalf("first %+v", first)
	}
	if !second.Awaiting || second.AwaitingOn != 2 {
		t.Fatalf("second %+v, want attempt 2 awaiting", second)
	}
	if last.Err != "" || last.Text != "after the parent's verdict" || last.Attempts != 3 {
		t.Fatalf("last %+v", last)
	}
}

// A workflow canceled after its call returned early (and then cleaning
// up) leaves the action alone: it still awaits its verdict, and the
// verdict applies.
func TestCancelingTheParentAfterAnEarlyReturnLeavesTheActionToItsVerdict(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 2*time.Hour), actiontest.Answer("resolved after the parent"))
	env.RegisterDelayedCallback(env.CancelWorkflow, 30*time.Minute)
	var during workflows.Status
	env.RegisterDelayedCallback(func() { during = statusOf(t, env, "parent-1-ask") }, time.Hour)
	env.ExecuteWorkflow(func(ctx workflow.Context) error {
		_, err := step.Call(ctx, "ask", ask("hi"), step.ReturnIfAwaiting(10*time.Minute))
		if !errors.Is(err, durallm.ErrAwaitingReconciliation) {
			return err
		}
		_ = workflow.Await(ctx, func() bool { return false }) // until canceled
		// Cleanup after the cancel, as a workflow does.
		dctx, _ := workflow.NewDisconnectedContext(ctx)
		_ = workflow.Sleep(dctx, time.Minute)
		return ctx.Err()
	})
	if !env.IsWorkflowCompleted() {
		t.Fatal("parent did not complete")
	}
	if during.State != workflows.StateAwaitingReconciliation || during.AwaitingAttempt != 1 {
		t.Fatalf("the action after its parent was canceled: %s awaiting %d %+v", during.State, during.AwaitingAttempt, during.Notes)
	}
	if st := statusOf(t, env, "parent-1-ask"); st.State != workflows.StateCompleted || st.Used != 2 {
		t.Fatalf("the action at the end: %s %s, %d attempts", st.State, st.Origin, st.Used)
	}
}

// A parent whose id is long still calls: the action id, and with it the
// default idempotency key, stays within 256 bytes.
func TestAParentIDOf250BytesCanCall(t *testing.T) {
	env, actions := newEnv(t)
	long := strings.Repeat("p", 250)
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: long})
	id := step.ActionID(long, "summary")
	actions.On(id, actiontest.Answer("a long parent's answer"))
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		f := step.StartCall(ctx, "summary", ask("hi"))
		res, err := f.Get(ctx)
		return []outcome{describe(ctx, start, f.ActionID(), res, err)}, nil
	})
	if o := out[0]; o.Err != "" || o.Text != "a long parent's answer" || o.ActionID != id || len(id) > 256 {
		t.Fatalf("outcome %+v (id of %d bytes)", o, len(id))
	}
}

// A call races a "stop" signal in a workflow.Selector: the call's Ready
// future is one like any other.
func TestACallRacesAStopSignalInASelector(t *testing.T) {
	race := func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		cctx, stopCall := workflow.WithCancel(ctx)
		f := step.StartCall(cctx, "ask", ask("hi"))
		var res workflows.ActionResult
		var err error
		stopped := false
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(f.Ready(), func(r workflow.Future) { err = r.Get(ctx, &res) })
		sel.AddReceive(workflow.GetSignalChannel(ctx, "stop"), func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(ctx, nil)
			stopped = true
		})
		sel.Select(ctx)
		if stopped {
			stopCall()
			res, err = f.Get(ctx)
		}
		return []outcome{describe(ctx, start, f.ActionID(), res, err)}, nil
	}
	t.Run("the stop wins", func(t *testing.T) {
		env, actions := newEnv(t)
		actions.On("ask", actiontest.Hold())
		env.RegisterDelayedCallback(func() { env.SignalWorkflow("stop", nil) }, 10*time.Second)
		o := run(t, env, race)[0]
		if !o.Action || o.State != workflows.StateCanceled || o.Origin != workflows.OriginParentCanceled || o.Attempts != 1 {
			t.Fatalf("outcome %+v", o)
		}
	})
	t.Run("the call wins", func(t *testing.T) {
		env, actions := newEnv(t)
		actions.On("ask", actiontest.Answer("before the stop").Taking(time.Second))
		env.RegisterDelayedCallback(func() { env.SignalWorkflow("stop", nil) }, time.Hour)
		o := run(t, env, race)[0]
		if o.Err != "" || o.Text != "before the stop" {
			t.Fatalf("outcome %+v", o)
		}
	})
}

// The action's start is observable before its end: Started gives its
// execution.
func TestTheActionsStartIsObservable(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Answer("an hour later").Taking(time.Hour))
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		f := step.StartCall(ctx, "ask", ask("hi"))
		var we workflow.Execution
		if err := f.Started().Get(ctx, &we); err != nil {
			return nil, err
		}
		started := outcome{ActionID: we.ID, Text: we.RunID, At: workflow.Now(ctx).Sub(start)}
		res, err := f.Get(ctx)
		return []outcome{started, describe(ctx, start, f.ActionID(), res, err)}, nil
	})
	if s := out[0]; s.ActionID != "parent-1-ask" || s.Text == "" || s.At >= time.Hour || out[1].Text != "an hour later" {
		t.Fatalf("outcomes %+v", out)
	}
}

// ActionID keeps the parent's id and the name where they fit, and is
// at most 256 bytes and a valid header value whatever they are, the
// same for the same parent and name and different for another name.
func TestActionIDFitsTheIdempotencyKey(t *testing.T) {
	long := strings.Repeat("x", 300)
	cases := []struct {
		name, parent, call string
		want               string // "" means a shortened id
	}{
		{"short", "order-42-agent", "ask", "order-42-agent-ask"},
		{"exactly 256", strings.Repeat("a", 251), "call", strings.Repeat("a", 251) + "-call"},
		{"a 250-byte parent", strings.Repeat("p", 250), "summary", ""},
		{"a 1000-byte parent", strings.Repeat("p", 1000), "ask", ""},
		{"a long name", "agent", long, ""},
		{"multibyte at the cut", strings.Repeat("é", 200), "ask", ""},
		{"a control character", "agent\n1", "ask", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := step.ActionID(c.parent, c.call)
			if c.want != "" && id != c.want {
				t.Fatalf("id %q, want %q", id, c.want)
			}
			in := ask("hi").WithDefaults(id)
			if len(id) > 256 || in.Validate() != nil {
				t.Fatalf("id of %d bytes: %v", len(id), in.Validate())
			}
			if id != step.ActionID(c.parent, c.call) || id == step.ActionID(c.parent, c.call+"2") {
				t.Fatal("not one id per parent and name")
			}
			if c.want == "" && !strings.HasPrefix(c.parent+"-"+c.call, strings.SplitN(id, "~", 2)[0]) {
				t.Fatalf("id %q does not begin with the parent's id", id)
			}
		})
	}
}

// Ready is ready when Get would not block: at the early return, at once
// again while the action still awaits the same verdict, and at the end.
func TestReadyIsReadyWhenGetWouldNotBlock(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, time.Hour), actiontest.Answer("after the verdict"))
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		f := step.StartCall(ctx, "ask", ask("hi"), step.ReturnIfAwaiting(10*time.Minute))
		var out []outcome
		for {
			var res workflows.ActionResult
			err := f.Ready().Get(ctx, &res)
			out = append(out, describe(ctx, start, f.ActionID(), res, err))
			if !errors.Is(err, durallm.ErrAwaitingReconciliation) {
				return out, nil
			}
			_ = workflow.Sleep(ctx, 20*time.Minute)
		}
	})
	// At 10m, then at 30m and 50m while it still awaits (the verdict
	// comes at 1h), then the end.
	if len(out) != 4 || !out[0].Awaiting || out[0].At != 10*time.Minute || !out[2].Awaiting || out[2].At != 50*time.Minute {
		t.Fatalf("outcomes %+v", out)
	}
	if last := out[3]; last.Err != "" || last.Text != "after the verdict" {
		t.Fatalf("last %+v", last)
	}
}

// A call that cannot start says so through Started too.
func TestStartedCarriesTheErrorOfACallThatCannotStart(t *testing.T) {
	env, _ := newEnv(t)
	env.ExecuteWorkflow(func(ctx workflow.Context) error {
		var we workflow.Execution
		err := step.StartCall(ctx, "", ask("hi")).Started().Get(ctx, &we)
		if !errors.Is(err, durallm.ErrInvalidInput) {
			return fmt.Errorf("started: %+v %w", we, err)
		}
		return nil
	})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
}
