package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/server/temporaltest"
	"google.golang.org/protobuf/proto"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/examples/agent"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
)

// BenchmarkAgentHistoryPerTurn measures the example agent's own history
// (examples/agent: calls named turn-<n>, its tools as activities,
// Continue-As-New every 10 turns) as its conversation grows, on the
// embedded server: each turn the model asks read_document for a
// document of 50 KB, so the conversation grows by 50 KB a turn (to 1.5
// MB), and turn 30 answers. Per iteration it runs the agent once on a
// stack whose every client stores payloads by reference
// (durallm.DataConverter, as the agent's README says) and once on a
// stack without it, every payload inline, and reports:
//
//   - parent-bytes/turn: the history of the agent's three runs over its
//     30 turns; parent-bytes/turn-1-10 and -21-30 are its first and last
//     runs' (target: under 4 KB, and flat);
//
//   - result-bytes/turn: the part of it that is the calls' results, which
//     stay in history (claimcheck.Inline);
//
//   - parent-bytes/turn-inline, -1-10-inline and -21-30-inline: the same
//     agent without the converter.
//
//     go test -run '^$' -bench BenchmarkAgentHistoryPerTurn -benchtime 1x ./internal/e2e/
func BenchmarkAgentHistoryPerTurn(b *testing.B) {
	ts := temporaltest.NewServer(temporaltest.WithBaseServerOptions(devserver.TemporaltestOption()))
	b.Cleanup(ts.Stop)
	p, err := providertest.NewProvider()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	const turns, growth = 30, 50 << 10
	docs := map[string]string{}
	var script []modelTurn
	for n := 1; n < turns; n++ {
		name := fmt.Sprintf("doc-%d", n)
		docs[name] = fmt.Sprintf("document %d: ", n) + prose(growth)
		script = append(script, modelTurn{calls: []toolCall{{"read_document", `{"name":"` + name + `"}`}}})
	}
	script = append(script, modelTurn{text: "All read."})
	var mu sync.Mutex
	var model *scriptedModel
	p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		m := model
		mu.Unlock()
		return m.behave(r)
	})

	// stackOn starts a durallm worker and the agent's worker on task
	// queues named for it, over tc.
	stackOn := func(name string, tc client.Client, store resultstore.Store) string {
		w, err := worker.New(tc, worker.Options{
			TaskQueue: "durallm-" + name, TLS: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler), Results: store,
			Config: routes.Config{Routes: []routes.Route{{Name: "bench", Kind: routes.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m", Capabilities: providers.Capabilities{Tools: true}}}},
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(w.Stop)
		aw := sdkworker.New(tc, "agent-"+name, sdkworker.Options{})
		aw.RegisterWorkflow(agent.Agent)
		aw.RegisterActivity(&agent.Activities{Results: store, Documents: docs})
		if err := aw.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(aw.Stop)
		return name
	}
	store := resultstore.Dir{Path: filepath.Join(b.TempDir(), "results")}
	byRef := ts.NewClientWithOptions(client.Options{DataConverter: durallm.DataConverter(store)})
	inline := ts.NewClientWithOptions(client.Options{DataConverter: converter.GetDefaultDataConverter()})
	stackOn("byref", byRef, store)
	stackOn("inline", inline, nil)

	// runAgent runs one agent and returns its history's bytes: over its
	// three runs, its first and last runs, and its calls' results.
	runAgent := func(tc client.Client, stack, id string) (total, first, last, results int) {
		mu.Lock()
		model = newScriptedModel(id, script)
		mu.Unlock()
		ctx := context.Background()
		run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "agent-" + stack}, agent.Agent,
			agent.Input{Question: "Read every document.", Routes: []string{"bench"}, DurallmTaskQueue: "durallm-" + stack, MaxTurns: turns})
		if err != nil {
			b.Fatal(err)
		}
		firstRun := run.GetRunID()
		var out agent.Output
		if err := run.Get(ctx, &out); err != nil || out.Turns != turns {
			b.Fatalf("agent %s: %d turns, %v", id, out.Turns, err)
		}
		hs := runs(b, tc, id, firstRun)
		if len(hs) != 3 {
			b.Fatalf("agent %s: %d runs", id, len(hs))
		}
		for i, events := range hs {
			n := 0
			for _, ev := range events {
				n += proto.Size(ev)
				if ev.GetEventType() == enumspb.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED {
					results += proto.Size(ev)
				}
			}
			total += n
			switch i {
			case 0:
				first = n
			case len(hs) - 1:
				last = n
			}
		}
		return total, first, last, results
	}
	sum := map[string]int{}
	b.ResetTimer()
	for i := range b.N {
		t, f, l, r := runAgent(byRef, "byref", fmt.Sprintf("agent-byref-%d", i))
		sum["all"], sum["first"], sum["last"], sum["results"] = sum["all"]+t, sum["first"]+f, sum["last"]+l, sum["results"]+r
		t, f, l, _ = runAgent(inline, "inline", fmt.Sprintf("agent-inline-%d", i))
		sum["all-inline"], sum["first-inline"], sum["last-inline"] = sum["all-inline"]+t, sum["first-inline"]+f, sum["last-inline"]+l
	}
	b.StopTimer()
	per := func(key string, n int) float64 { return float64(sum[key]) / float64(n*b.N) }
	b.ReportMetric(per("all", turns), "parent-bytes/turn")
	b.ReportMetric(per("first", 10), "parent-bytes/turn-1-10")
	b.ReportMetric(per("last", 10), "parent-bytes/turn-21-30")
	b.ReportMetric(per("results", turns), "result-bytes/turn")
	b.ReportMetric(per("all-inline", turns), "parent-bytes/turn-inline")
	b.ReportMetric(per("first-inline", 10), "parent-bytes/turn-1-10-inline")
	b.ReportMetric(per("last-inline", 10), "parent-bytes/turn-21-30-inline")
}
