package devserver

import (
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	enumsspb "go.temporal.io/server/api/enums/v1"
	historyspb "go.temporal.io/server/api/history/v1"
	"go.temporal.io/server/common/clock"
	"go.temporal.io/server/common/definition"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/metrics"
	"go.temporal.io/server/common/namespace"
	"go.temporal.io/server/service/history/events"
)

// The server's history event notifier, which wakes a caller long-polling
// for an action's result (GetWorkflowExecutionHistory with wait_new_event
// and the close-event filter), gives each waiter a channel of one and
// drops a notification when that channel is still full
// (events.NotifierImpl.dispatchHistoryEventNotification, "this should NOT
// happen, unless there is a bug or high load"). So when two updates of a
// workflow arrive before the waiter has read the first (the last workflow
// task's start, then the close, with the waiter's goroutine waiting for a
// core), the close is lost: the waiter reads "running" and sleeps until
// its long poll expires (history.longPollExpirationInterval, 20 s by
// default), and the caller gets the result 20 s after the action ended.
// BenchmarkSequentialLatency shows it (a 20.01 s p99 with the workflow
// closed at 43 ms, logged by its slowest-run history).
//
// This test pins the server's behaviour: when it fails, the notifier no
// longer loses wakeups and devDynamicConfig's short long poll (below)
// can go.
func TestTheServerLosesALongPollWakeupWhenTwoArriveBeforeItIsRead(t *testing.T) {
	n := events.NewNotifier(clock.NewRealTimeSource(), metrics.NoopMetricsHandler, func(namespace.ID, string) int32 { return 1 })
	n.Start()
	defer n.Stop()
	notification := func(wf string, next int64, status enumspb.WorkflowExecutionStatus) *events.Notification {
		return events.NewNotification("ns", &commonpb.WorkflowExecution{WorkflowId: wf, RunId: "run"}, 1, 1, next, 1,
			enumsspb.WORKFLOW_EXECUTION_STATE_RUNNING, status, &historyspb.VersionHistories{}, nil)
	}
	action := definition.NewWorkflowKey("ns", "action", "run")
	_, waiter, err := n.WatchHistoryEvent(action)
	if err != nil {
		t.Fatal(err)
	}
	// The notifier dispatches in order on one goroutine, so once a third
	// workflow's waiter has its notification, both of ours were handled.
	marker := definition.NewWorkflowKey("ns", "marker", "run")
	_, markerCh, err := n.WatchHistoryEvent(marker)
	if err != nil {
		t.Fatal(err)
	}
	n.NotifyNewHistoryEvent(notification("action", 12, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING))
	n.NotifyNewHistoryEvent(notification("action", 16, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED))
	n.NotifyNewHistoryEvent(notification("marker", 2, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING))
	select {
	case <-markerCh:
	case <-time.After(10 * time.Second):
		t.Fatal("the notifier dispatched nothing")
	}
	if got := <-waiter; got.WorkflowStatus != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		t.Fatalf("first wakeup: %v", got.WorkflowStatus)
	}
	select {
	case got := <-waiter:
		t.Fatalf("the close reached the waiter (%v): the server no longer loses wakeups, the devserver's short long poll can go", got.WorkflowStatus)
	default:
	}
}

// Against the lost wakeup above, the embedded server ends every history
// long poll after longPollInterval, so a caller that missed its wakeup
// asks again (the SDKs re-poll at once) and finds the action closed
// within that bound instead of 20 s.
func TestTheHistoryLongPollIsShort(t *testing.T) {
	got, ok := devDynamicConfig()[dynamicconfig.HistoryLongPollExpirationInterval.Key()]
	if !ok || got != longPollInterval || longPollInterval > 5*time.Second {
		t.Fatalf("history.longPollExpirationInterval is %v (set: %v), want a few seconds", got, ok)
	}
}
