package e2e_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	durallm "github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/resultstore/pgstore"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
)

func resultBackends(pg *pgserver.Server) map[string]func(t *testing.T) resultstore.Expirable {
	return map[string]func(t *testing.T) resultstore.Expirable{
		"dir": func(t *testing.T) resultstore.Expirable {
			return resultstore.Dir{Path: filepath.Join(t.TempDir(), "results")}
		},
		"postgres": func(t *testing.T) resultstore.Expirable {
			s, err := pgstore.Open(context.Background(), pg.FreshDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			return s
		},
	}
}

// A durallm worker sweeps its result store by itself: the result of an
// action that ended goes once the (here, tiny) retention has passed, while
// the result of an action that still runs, and one stored for no action,
// are kept.
func TestTheWorkerSweepsItsResults(t *testing.T) {
	pg, tc := sweepServers(t)
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SetDefault(providertest.Answer("an answer too large for history, in this test"))
	for name, open := range resultBackends(pg) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			store := open(t)
			queue := "results-" + name
			newWorker := func(retention time.Duration) *worker.Worker {
				// Every response goes to the store.
				return startSweepingWorker(t, tc, p, worker.Options{TaskQueue: queue, Results: store, LargeResponseBytes: 1, ResultRetention: retention})
			}
			// The first worker does not sweep (negative retention).
			w := newWorker(-1)
			res, err := runHello(ctx, durallm.NewClient(tc, queue).WithResults(store), "results-swept-"+name)
			if err != nil || res.ResultRef == "" || res.Response == nil {
				t.Fatalf("result %+v %v: want a response resolved from the store", res, err)
			}
			w.Stop()
			closedRef := res.ResultRef

			// An action that still runs, with a result stored for it, and
			// a result stored for no action.
			holdQueue := "hold-results-" + name
			hw := sdkworker.New(tc, holdQueue, sdkworker.Options{})
			hw.RegisterWorkflowWithOptions(hold, workflow.RegisterOptions{Name: "hold"})
			if err := hw.Start(); err != nil {
				t.Fatal(err)
			}
			defer hw.Stop()
			running, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "results-running-" + name, TaskQueue: holdQueue}, "hold")
			if err != nil {
				t.Fatal(err)
			}
			defer tc.TerminateWorkflow(ctx, running.GetID(), "", "test over")
			runningRef, err := store.PutFor(ctx, running.GetID(), []byte("the running action's answer"))
			if err != nil {
				t.Fatal(err)
			}
			unclaimed, err := store.Put(ctx, []byte("stored for no action"))
			if err != nil {
				t.Fatal(err)
			}

			// A worker that sweeps, with a tiny retention, removes the
			// closed action's result.
			defer newWorker(time.Nanosecond).Stop()
			untilGone(t, "result "+closedRef, func() (bool, error) {
				_, err := store.Get(ctx, closedRef)
				if errors.Is(err, resultstore.ErrNotFound) {
					return false, nil
				}
				return true, err
			})
			for what, ref := range map[string]string{"the running action's": runningRef, "the unclaimed": unclaimed} {
				if _, err := store.Get(ctx, ref); err != nil {
					t.Errorf("%s result was swept: %v", what, err)
				}
			}
		})
	}
}
