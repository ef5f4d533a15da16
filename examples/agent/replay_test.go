package agent_test

import (
	"log/slog"
	"os"
	"testing"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/examples/agent"
)

// TestReplayTheRecordedAgent replays a history recorded from a real run on
// the embedded Temporal server: two LLM calls (child actions) and the
// lookup_order activity between them. A change that makes Agent, or
// step.Call under it, non-deterministic against it fails here. Re-record
// it with `go test ./internal/e2e -run TestE2EStepTwoCalls -update-histories`.
//
// A call's action id is the workflow's id plus its name, so the replay
// runs under the recorded workflow id: the replayer's default id
// ("ReplayId") would name other actions than the history started.
func TestReplayTheRecordedAgent(t *testing.T) {
	f, err := os.Open("testdata/agent.json")
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
}
