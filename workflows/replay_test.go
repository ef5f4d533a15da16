package workflows

import (
	"log/slog"
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// TestReplayRecordedHistories replays histories recorded from real runs on
// the embedded Temporal server (regenerate them with
// `go test -run TestE2E -update-histories ./internal/e2e` from the repository root). A
// change that makes LLMAction non-deterministic against them fails here.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	// happy_path_upsert_queued.json is the happy path as recorded before
	// attempt.StateUpsertsSkipQueued (an upsert for queued, then one for
	// dispatching); happy_path.json has only the dispatching one.
	// happy_path_deadline_timer.json is the happy path as recorded before
	// attempt.DeadlineTimerNearDeadline, with a deadline timer around the
	// attempt; the others were re-recorded after it. spend_exhausted.json
	// is an action with a token budget: two 500s, and a third attempt that
	// did not fit was never sent.
	want := map[string]bool{"happy_path.json": false, "happy_path_upsert_queued.json": false, "happy_path_deadline_timer.json": false, "goaway_retry.json": false, "reconciliation.json": false, "cancellation.json": false, "spend_exhausted.json": false}
	for _, f := range files {
		want[filepath.Base(f)] = true
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflowWithOptions(LLMAction, workflow.RegisterOptions{Name: WorkflowName})
			if err := r.ReplayWorkflowHistoryFromJSONFile(log.NewStructuredLogger(slog.New(slog.DiscardHandler)), f); err != nil {
				t.Fatalf("replay %s: %v", f, err)
			}
		})
	}
	for name, found := range want {
		if !found {
			t.Errorf("recorded history %s is missing", name)
		}
	}
}
