package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/temporaltest"

	"github.com/durallm/durallm/internal/devserver"
)

// What Temporal's own task-queue rate limit does, measured before
// choosing where the routes' fleet-wide limits are kept
// (docs/performance.md, "Fleet-wide limits"): a worker option
// (TaskQueueActivitiesPerSecond) that the matching service applies to
// every activity of the task queue together, in activities per second.
// A burst of activities is dispatched at the limit's pace; the rest wait
// in the queue, where their ScheduleToStart runs, with nothing in the UI
// but "scheduled". It has no tokens, no requests in flight, no per-route
// limit (one task queue per route would be), and no way to hear a 429.
//
//	go test ./internal/e2e -run '^$' -bench TaskQueueRateLimit -benchtime 1x
func BenchmarkTaskQueueRateLimit(b *testing.B) {
	const perSecond, activities = 5.0, 40
	ts := temporaltest.NewServer(temporaltest.WithBaseServerOptions(devserver.TemporaltestOption()))
	defer ts.Stop()
	tc := ts.GetDefaultClient()
	tq := "rate-limited"
	w := sdkworker.New(tc, tq, sdkworker.Options{TaskQueueActivitiesPerSecond: perSecond})
	queued := make(chan time.Duration, activities)
	w.RegisterActivityWithOptions(func(ctx context.Context) error {
		info := activity.GetInfo(ctx)
		queued <- info.StartedTime.Sub(info.ScheduledTime)
		return nil
	}, activity.RegisterOptions{Name: "noop"})
	w.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute, ScheduleToStartTimeout: 5 * time.Minute})
		var fs []workflow.Future
		for range activities {
			fs = append(fs, workflow.ExecuteActivity(ctx, "noop"))
		}
		for _, f := range fs {
			if err := f.Get(ctx, nil); err != nil {
				return err
			}
		}
		return nil
	}, workflow.RegisterOptions{Name: "burst"})
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	for range b.N {
		start := time.Now()
		run, err := tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{TaskQueue: tq}, "burst")
		if err != nil {
			b.Fatal(err)
		}
		if err := run.Get(context.Background(), nil); err != nil {
			b.Fatal(err)
		}
		elapsed := time.Since(start)
		waits := make([]time.Duration, 0, activities)
		for range activities {
			waits = append(waits, <-queued)
		}
		slices.Sort(waits)
		b.ReportMetric(float64(activities)/elapsed.Seconds(), "activities/s")
		b.ReportMetric(perSecond, "limit/s")
		b.ReportMetric(float64(waits[len(waits)/2].Milliseconds()), "p50-queued-ms")
		b.ReportMetric(float64(waits[len(waits)-1].Milliseconds()), "max-queued-ms")
	}
}
