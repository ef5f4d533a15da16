package agent_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/examples/agent"
)

// TestReplayTheRecordedAgent replays the histories of an agent's two runs
// recorded on the embedded Temporal server: the first calls the model
// twice, running two tools at once after the first call and one after
// the second, then continues as new; the second, carrying the
// conversation and the turn count, makes turn 3's call, which answers. A
// change that makes Agent, or package step under it, non-deterministic
// against them fails here. Re-record them with
// `go test ./internal/e2e -run TestE2EAgentAnswersEveryToolCallAndContinuesAsNew -update-histories`.
//
// A call's action id is the workflow's id plus its name, so the replay
// runs under the recorded workflow id: the replayer's default id
// ("ReplayId") would name other actions than the history started.
func TestReplayTheRecordedAgent(t *testing.T) {
	for _, name := range []string{"agent_run1.json", "agent_run2.json"} {
		t.Run(name, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			h, err := client.HistoryFromJSON(f, client.HistoryJSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(agent.Agent)
			err = r.ReplayWorkflowHistoryWithOptions(log.NewStructuredLogger(slog.New(slog.DiscardHandler)), h,
				worker.ReplayWorkflowHistoryOptions{OriginalExecution: workflow.Execution{ID: "agent-e2e"}})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
