package e2e_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// TestReplayRecordedStepParents replays histories of parent workflows
// that call package step, recorded on the embedded server (re-record
// the current ones with `go test -run TestE2EStep -update-histories
// ./internal/e2e`). A change to step that a running parent's history
// could not replay fails here. Histories whose name says "before" were
// recorded by an earlier step and are kept as they are: a parent that
// was running when its worker was upgraded replays them.
func TestReplayRecordedStepParents(t *testing.T) {
	cases := []struct {
		file, id string
		wf       any
	}{
		{"step_early_return.json", "patient", patientParent},
		{"step_early_return_before_identity.json", "patient", patientParent},
		{"step_retried.json", "retried", planThenFailOnce},
		// A retry that failed at its call, as it did before a call's
		// identity outlived its runs.
		{"step_retried_before_identity.json", "retried", planThenFailOnce},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			h, err := client.HistoryFromJSON(f, client.HistoryJSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(c.wf)
			if err := r.ReplayWorkflowHistoryWithOptions(log.NewStructuredLogger(slog.New(slog.DiscardHandler)), h,
				worker.ReplayWorkflowHistoryOptions{OriginalExecution: workflow.Execution{ID: c.id}}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
