package actiontest_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/actiontest"
	"github.com/durallm/durallm/workflows"
)

// hi is a small call's input.
var hi = workflows.ActionInput{Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}}, Routes: []string{"a"}}

// answer is a parent that calls name once and returns the answer's text.
func answer(name string) func(ctx workflow.Context) (string, error) {
	return func(ctx workflow.Context) (string, error) {
		res, err := step.Call(ctx, name, hi)
		if err != nil || res.Response == nil {
			return "", err
		}
		return res.Response.Text, nil
	}
}

// A call whose action id is hashed (its parent's id is long) is scripted,
// asserted and reported by the name the parent gave it.
func TestACallUnderAHashedActionIDIsScriptedByItsName(t *testing.T) {
	env := newEnv(t)
	long := strings.Repeat("p", 300)
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: long})
	if id := step.ActionID(long, "ask"); !strings.Contains(id, "~") {
		t.Fatalf("the action id %q is not hashed", id)
	}
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Answer("by name"))
	env.ExecuteWorkflow(answer("ask"))
	var text string
	if err := env.GetWorkflowResult(&text); err != nil || text != "by name" {
		t.Fatalf("got %q, %v", text, err)
	}
	if sent := actions.Sent("ask"); len(sent) != 1 || sent[0].ActionRef != step.ActionID(long, "ask") {
		t.Fatalf("sent %+v", sent)
	}
	actions.AssertExpectations(t)
}

// reached is what a parent saw of a call it made, or attached to, twice.
type reached struct {
	Texts []string        `json:"texts"`
	At    []time.Duration `json:"at"`
	Errs  []string        `json:"errs"`
}

func (r *reached) see(ctx workflow.Context, start time.Time, res workflows.ActionResult, err error) {
	text := ""
	if res.Response != nil {
		text = res.Response.Text
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	r.Texts, r.At, r.Errs = append(r.Texts, text), append(r.At, workflow.Now(ctx).Sub(start)), append(r.Errs, msg)
}

func runReached(t *testing.T, env *testsuite.TestWorkflowEnvironment, wf func(ctx workflow.Context) (reached, error)) reached {
	t.Helper()
	env.ExecuteWorkflow(wf)
	var r reached
	if err := env.GetWorkflowResult(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// The same name called again after the first call ended gets its result
// (step reaches it through DescribeCall): one action, executed once.
func TestTheSameNameTwiceInAUnitTestGetsTheFirstCallsResult(t *testing.T) {
	env := newEnv(t)
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Answer("once"))
	r := runReached(t, env, func(ctx workflow.Context) (reached, error) {
		var r reached
		start := workflow.Now(ctx)
		for range 2 {
			res, err := step.Call(ctx, "ask", hi)
			r.see(ctx, start, res, err)
		}
		return r, nil
	})
	if r.Texts[0] != "once" || r.Texts[1] != "once" || r.Errs[1] != "" || r.At[1] != r.At[0] {
		t.Fatalf("reached %+v", r)
	}
	if n := len(actions.Sent("ask")); n != 1 {
		t.Fatalf("%d attempts sent", n)
	}
	actions.AssertExpectations(t)
}

// The same name called again while the first call runs waits for it
// (AwaitCall), and learns of its end within a second of virtual time.
func TestTheSameNameWhileTheFirstRunsWaitsForItInAUnitTest(t *testing.T) {
	env := newEnv(t)
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Answer("slow").Taking(time.Minute))
	r := runReached(t, env, func(ctx workflow.Context) (reached, error) {
		var r reached
		start := workflow.Now(ctx)
		first, second := step.StartCall(ctx, "ask", hi), step.StartCall(ctx, "ask", hi)
		for _, f := range []*step.Future{second, first} {
			res, err := f.Get(ctx)
			r.see(ctx, start, res, err)
		}
		return r, nil
	})
	if r.Texts[0] != "slow" || r.Texts[1] != "slow" || r.At[0] != r.At[1] {
		t.Fatalf("reached %+v", r)
	}
	if n := len(actions.Sent("ask")); n != 1 {
		t.Fatalf("%d attempts sent", n)
	}
}

// Attach watches a call by its action id: with ReturnIfAwaiting it
// returns while the call awaits its verdict, then waits for its end; an
// id no action has is durallm.ErrNotFound.
func TestAttachInAUnitTestWatchesACallByItsID(t *testing.T) {
	env := newEnv(t)
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 2*time.Minute), actiontest.Answer("after the verdict"))
	var awaiting, notFound bool
	r := runReached(t, env, func(ctx workflow.Context) (reached, error) {
		var r reached
		start := workflow.Now(ctx)
		f := step.StartCall(ctx, "ask", hi)
		if err := f.Started().Get(ctx, nil); err != nil {
			return r, err
		}
		w := step.Attach(ctx, f.ActionID(), step.ReturnIfAwaiting(time.Minute))
		res, err := w.Get(ctx)
		awaiting = errors.Is(err, durallm.ErrAwaitingReconciliation)
		r.see(ctx, start, res, err)
		_ = workflow.Await(ctx, w.Ended)
		res, err = w.Get(ctx)
		r.see(ctx, start, res, err)
		_, err = step.Attach(ctx, "nobody-ask").Get(ctx)
		notFound = errors.Is(err, durallm.ErrNotFound)
		return r, nil
	})
	if !awaiting || !notFound || r.Texts[1] != "after the verdict" || r.At[0] != time.Minute || r.At[1] != 2*time.Minute {
		t.Fatalf("reached %+v, awaiting %v, not found %v", r, awaiting, notFound)
	}
	actions.AssertExpectations(t)
}

// asker is a workflow of the user's that asks once.
func asker(ctx workflow.Context) (string, error) { return answer("ask")(ctx) }

// A new workflow under a closed one's id makes a call of its own, under
// name@chain (step.ActionID): scripted, asserted and reported by the
// name it gave it, the closed one's call by its action id.
func TestANewWorkflowsCallUnderAClosedOnesIDIsScriptedByItsName(t *testing.T) {
	env := newEnv(t)
	env.RegisterWorkflow(asker)
	actions := actiontest.Register(t, env)
	actions.On(step.ActionID("job", "ask"), actiontest.Answer("the first job's"))
	actions.On("ask", actiontest.Answer("the second job's"))
	env.ExecuteWorkflow(func(ctx workflow.Context) ([]string, error) {
		var texts []string
		for range 2 {
			var text string
			cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{WorkflowID: "job"})
			if err := workflow.ExecuteChildWorkflow(cctx, asker).Get(ctx, &text); err != nil {
				return nil, err
			}
			texts = append(texts, text)
		}
		return texts, nil
	})
	var texts []string
	if err := env.GetWorkflowResult(&texts); err != nil || len(texts) != 2 || texts[0] != "the first job's" || texts[1] != "the second job's" {
		t.Fatalf("got %q, %v", texts, err)
	}
	// Both calls are named "ask" by their workflows.
	sent := actions.Sent("ask")
	if len(sent) != 2 || sent[0].ActionRef != "job-ask" || !strings.HasPrefix(sent[1].ActionRef, "job-ask@") {
		t.Fatalf("sent %+v", sent)
	}
	actions.AssertExpectations(t)
}
