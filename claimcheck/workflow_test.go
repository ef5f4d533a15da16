package claimcheck_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/claimcheck"
)

// Payloads a parent, its activity and its child write, each large enough
// to be stored.
var (
	activityIn  = text(4<<10) + "activity input"
	activityOut = text(4<<10) + "activity result"
	childIn     = text(4<<10) + "child input"
	childOut    = text(4<<10) + "child result"
	parentOut   = text(4<<10) + "parent result"
)

type report struct {
	Active bool   `json:"active"`
	Out    string `json:"out"`
}

func echo(_ context.Context, in string) (string, error) {
	if in != activityIn {
		return "", errors.New("the activity got another input")
	}
	return activityOut, nil
}

func child(_ workflow.Context, in string) (string, error) {
	if in != childIn {
		return "", errors.New("the child got another input")
	}
	return childOut, nil
}

func parent(ctx workflow.Context) (report, error) {
	r := report{Active: claimcheck.Active(ctx)}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	var got string
	if err := workflow.ExecuteActivity(actx, echo, activityIn).Get(ctx, &got); err != nil || got != activityOut {
		return r, errors.Join(errors.New("activity"), err)
	}
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{WorkflowID: "the-child"})
	if err := workflow.ExecuteChildWorkflow(cctx, child, childIn).Get(ctx, &got); err != nil || got != childOut {
		return r, errors.Join(errors.New("child"), err)
	}
	r.Out = parentOut
	return r, nil
}

func runParent(t *testing.T, dc converter.DataConverter) (report, error) {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "the-parent"})
	if dc != nil {
		env.SetDataConverter(dc)
	}
	env.RegisterActivity(echo)
	env.RegisterWorkflow(child)
	env.ExecuteWorkflow(parent)
	if !env.IsWorkflowCompleted() {
		t.Fatal("the parent did not complete")
	}
	var r report
	if err := env.GetWorkflowError(); err != nil {
		return r, err
	}
	if err := env.GetWorkflowResult(&r); err != nil {
		t.Fatal(err)
	}
	return r, nil
}

// Each payload a workflow writes is stored for every workflow whose
// history holds its reference: an activity's for its workflow, a child's
// input for the parent and the child, a child's result for the child and
// the parent that reads it.
func TestWhatAWorkflowStoresIsClaimedForTheWorkflowsThatHoldIt(t *testing.T) {
	store := dirStore(t)
	r, err := runParent(t, claimcheck.DataConverter(store, claimcheck.Options{Logger: quiet}))
	if err != nil || !r.Active || r.Out != parentOut {
		t.Fatalf("parent: %+v %v", r, err)
	}
	got := claims(t, store)
	for what, c := range map[string]struct {
		v    any
		want []string
	}{
		"the activity's input":  {activityIn, []string{"the-parent"}},
		"the activity's result": {activityOut, []string{"the-parent"}},
		"the child's input":     {childIn, []string{"the-child", "the-parent"}},
		"the child's result":    {childOut, []string{"the-child", "the-parent"}},
		"the parent's result":   {r, []string{"the-parent"}},
	} {
		have := slices.Clone(got[refOf(t, c.v)])
		slices.Sort(have)
		if !slices.Equal(have, c.want) {
			t.Errorf("%s is claimed for %v, want %v", what, have, c.want)
		}
	}
}

// Active tells a workflow whether its worker stores large payloads by
// reference.
func TestActiveSaysWhetherTheWorkersConverterStores(t *testing.T) {
	r, err := runParent(t, nil)
	if err != nil || r.Active {
		t.Fatalf("the SDK's default converter: %+v %v", r, err)
	}
	r, err = runParent(t, claimcheck.DataConverter(dirStore(t), claimcheck.Options{Logger: quiet}))
	if err != nil || !r.Active {
		t.Fatalf("claimcheck's: %+v %v", r, err)
	}
}

func largeActivity(ctx workflow.Context, n int) (string, error) {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	var got string
	err := workflow.ExecuteActivity(actx, count, text(n)).Get(ctx, &got)
	return got, err
}

func count(_ context.Context, in string) (string, error) { return "ok", nil }

// In workflow code, a store that fails on a payload too large for
// history fails the workflow task (a panic Temporal retries), never the
// workflow with an error; one that fits travels inline.
func TestInWorkflowCodeAFailingStoreFailsTheTaskNotTheWorkflow(t *testing.T) {
	for _, tc := range []struct {
		n     int
		panic bool
	}{{100 << 10, false}, {claimcheck.InlineLimit + 1, true}} {
		var s testsuite.WorkflowTestSuite
		env := s.NewTestWorkflowEnvironment()
		env.SetDataConverter(claimcheck.DataConverter(failingStore{}, claimcheck.Options{Logger: quiet}))
		env.RegisterActivity(count)
		env.ExecuteWorkflow(largeActivity, tc.n)
		err := env.GetWorkflowError()
		var pe *temporal.PanicError
		if errors.As(err, &pe) != tc.panic {
			t.Fatalf("%d bytes: %v", tc.n, err)
		}
	}
}
