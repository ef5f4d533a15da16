package e2e_test

import (
	"context"
	"flag"
	"path/filepath"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/internal/actionshape"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

var updateShapes = flag.Bool("update-shapes", false, "write the real shapes testsuite/actiontest's comparison reads")

// serverShapes is where the real shapes are recorded, for
// TestScriptedActionsReturnWhatTheRealOnesReturn (testsuite/actiontest).
var serverShapes = filepath.Join("..", "..", "testsuite", "actiontest", "testdata", "server_shapes.json")

// The real LLMAction with the real activities, on a Temporal server, in
// the cases the SDK's test environment cannot show: there a canceled
// activity settles at once, without its outcome (it ignores
// WaitForCancellation), so a canceled attempt would have no evidence and a
// cancel after the commit no text. Each case runs actionshape.Parent
// against the provider and records what it saw; testsuite/actiontest's
// comparison holds its scripted actions to these records. Run with
// -update-shapes to record them again after an intended change.
func TestE2ERealActionShapesOnAServer(t *testing.T) {
	streamed := func(in workflows.ActionInput) workflows.ActionInput {
		in.Request.Stream = true
		return in
	}
	in := workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "say hello")}},
		Routes:  []string{"primary", "fallback"},
	}
	cancelParent := func(tc client.Client) error { return tc.CancelWorkflow(context.Background(), "parent", "") }
	cancelAction := func(tc client.Client) error { return tc.CancelWorkflow(context.Background(), "parent-ask", "") }
	stop := func(tc client.Client) error {
		return tc.SignalWorkflow(context.Background(), "parent-ask", "", workflows.SignalCancel, workflows.CancelRequest{Origin: workflows.OriginUserStop})
	}
	tests := []struct {
		name string
		in   workflows.ActionInput
		real providertest.Behavior
		// content: the event waits for the attempt's content to reach
		// the worker (its heartbeat says so), else for the request to
		// reach the provider.
		content bool
		event   func(client.Client) error
	}{
		{"canceled by parent_canceled: the parent canceled", in, providertest.Hold(), false, cancelParent},
		{"canceled by parent_canceled: the action canceled through Temporal", in, providertest.Hold(), false, cancelAction},
		{"canceled after the commit: the parent canceled mid-stream", streamed(in), providertest.StreamStall(2), true, cancelParent},
		{"stopped by a cancel signal: user_stop", in, providertest.Hold(), false, stop},
	}
	recorded := map[string]any{}
	if !*updateShapes {
		var err error
		if recorded, err = actionshape.Read(serverShapes); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]any{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStack(t)
			// The routes of the comparison's own real worker: a model
			// named as its route, every capability.
			caps := providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true, Vision: true}
			s.startWorker(func(o *worker.Options) {
				o.Config = routes.Config{Routes: []routes.Route{
					{Name: "primary", Kind: "openai", BaseURL: s.p.URL() + "/v1", Model: "primary", Capabilities: caps},
					{Name: "fallback", Kind: "openai", BaseURL: s.p.URL() + "/v1", Model: "fallback", Capabilities: caps},
				}}
			})
			q := s.tq + "-parents"
			w := sdkworker.New(s.tc, q, sdkworker.Options{})
			w.RegisterWorkflow(actionshape.Parent)
			if err := w.Start(); err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			s.p.Push(tt.real)
			run := s.startParent("parent", q, actionshape.Parent, actionshape.Input{Action: tt.in, TaskQueue: s.tq})
			waitFor(t, func() bool { return s.p.ExecutedCount("parent-ask") == 1 })
			if tt.content {
				waitFor(t, func() bool { return heartbeat(s, "parent-ask").ContentStarted })
			}
			if err := tt.event(s.tc); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var c actionshape.Call
			if err := run.Get(ctx, &c); err != nil {
				t.Fatalf("parent: %v", err)
			}
			shape, err := actionshape.Of(c)
			if err != nil {
				t.Fatal(err)
			}
			got[tt.name] = shape
			if *updateShapes {
				return
			}
			if d := actionshape.Diff("now", shape, "recorded", recorded[tt.name]); d != "" {
				t.Fatalf("the real action differs from its record (run with -update-shapes after an intended change, and make actiontest's scripts return it):\n%s", d)
			}
		})
	}
	if *updateShapes && !t.Failed() {
		if err := actionshape.Write(serverShapes, got); err != nil {
			t.Fatal(err)
		}
	}
}

// heartbeat is the last progress the running attempt of action id
// reported, zero when none.
func heartbeat(s *stack, id string) attempt.Progress {
	var p attempt.Progress
	d, err := s.tc.DescribeWorkflowExecution(context.Background(), id, "")
	if err != nil || len(d.GetPendingActivities()) == 0 || d.GetPendingActivities()[0].GetHeartbeatDetails() == nil {
		return p
	}
	_ = converter.GetDefaultDataConverter().FromPayloads(d.GetPendingActivities()[0].GetHeartbeatDetails(), &p)
	return p
}
