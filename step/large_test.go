package step_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/actiontest"
)

// oneCall makes one call asking n times a phrase of 20 bytes.
func oneCall(ctx workflow.Context, n int) ([]outcome, error) {
	start := workflow.Now(ctx)
	res, err := step.Call(ctx, "big", ask(strings.Repeat("a long conversation ", n)))
	o := describe(ctx, start, step.ActionID(parentID, "big"), res, err)
	o.TooLarge = errors.Is(err, resultstore.ErrTooLarge)
	return []outcome{o}, nil
}

// A call larger than Temporal takes inline, from a worker whose data
// converter would put it in history, is the call's error: on a server,
// the SDK would fail the parent's workflow task for ever with
// PayloadsTooLarge and the call would never return.
func TestALargeCallFromAWorkerWithoutTheConverterIsAnErrorNotATaskFailingForEver(t *testing.T) {
	env, actions := newEnv(t)
	// Building and measuring a 3 MB input in workflow code takes longer
	// than the SDK's 1 s deadlock bound under -race on a busy machine:
	// that is the test's cost, not the call's.
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute, Interceptors: []interceptor.WorkerInterceptor{actions.Interceptor()}})
	started := 0
	env.SetOnChildWorkflowStartedListener(func(*workflow.Info, workflow.Context, converter.EncodedValues) { started++ })
	out := run(t, env, oneCall, 150_000) // 3 MB
	if !out[0].Invalid || out[0].Action || !strings.Contains(out[0].Err, "durallm.DataConverter") || started != 0 {
		t.Fatalf("outcome %+v, %d started", out[0], started)
	}
}

// A large call from a worker dialed with durallm.DataConverter is stored
// by reference, for the parent and the action, and answered.
func TestALargeCallFromAWorkerWithTheConverterIsStoredForTheParentAndTheAction(t *testing.T) {
	env, actions := newEnv(t)
	store := resultstore.Dir{Path: filepath.Join(t.TempDir(), "results")}
	env.SetDataConverter(durallm.DataConverter(store))
	actions.On("big", actiontest.Answer("read it all"))
	out := run(t, env, oneCall, 10_000) // 200 KB
	if out[0].Err != "" || out[0].Text != "read it all" {
		t.Fatalf("outcome %+v", out[0])
	}
	holders := map[string]bool{}
	if err := store.Older(context.Background(), time.Now().Add(time.Hour), func(c resultstore.Claim) error {
		holders[c.ActionRef] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !holders[parentID] || !holders[step.ActionID(parentID, "big")] {
		t.Fatalf("stored for %v", holders)
	}
}

// A call larger than the worker's result store keeps is an invalid input
// (also resultstore.ErrTooLarge), and nothing is started.
func TestACallLargerThanTheStoreKeepsIsInvalidAndStartsNothing(t *testing.T) {
	env, _ := newEnv(t)
	store := resultstore.Dir{Path: filepath.Join(t.TempDir(), "results"), MaxBytes: 1 << 20}
	env.SetDataConverter(claimcheck.DataConverter(store, claimcheck.Options{}))
	started := 0
	env.SetOnChildWorkflowStartedListener(func(*workflow.Info, workflow.Context, converter.EncodedValues) { started++ })
	out := run(t, env, oneCall, 100_000) // 2 MB
	if !out[0].Invalid || !out[0].TooLarge || out[0].Action || started != 0 {
		t.Fatalf("outcome %+v, %d started", out[0], started)
	}
}
