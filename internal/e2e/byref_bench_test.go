package e2e_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/temporaltest"
	"google.golang.org/protobuf/proto"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// agentIn is a test agent's: Turns calls, the conversation growing by a
// user message of Growth bytes and the answer each turn.
type agentIn struct {
	Turns  int    `json:"turns"`
	Growth int    `json:"growth"`
	Queue  string `json:"queue"`
}

// growingAgent is a user's agent loop: each turn one call with the whole
// conversation so far, the answer appended to it.
func growingAgent(ctx workflow.Context, in agentIn) (int, error) {
	var conv []providers.Message
	for turn := 1; turn <= in.Turns; turn++ {
		conv = append(conv, providers.TextMessage("user", fmt.Sprintf("turn %d: ", turn)+prose(in.Growth)))
		res, err := step.Call(ctx, fmt.Sprintf("turn-%d", turn), workflows.ActionInput{
			Request: providers.Request{Messages: conv}, Routes: []string{"bench"},
		}, step.TaskQueue(in.Queue))
		if err != nil {
			return turn, err
		}
		conv = append(conv, providers.TextMessage("assistant", res.Response.Text))
	}
	return in.Turns, nil
}

// prose is n bytes of a long document, as a long context holds: lines of
// text, a quotation now and then.
func prose(n int) string {
	const para = "The shipment left the warehouse on Monday and is expected on Thursday; the customer asked twice.\n" +
		"Order 42 holds three items, one of them \"fragile\", packed separately with a note for the carrier.\n\n"
	return strings.Repeat(para, n/len(para)+1)[:n]
}

// BenchmarkRequestsByReference measures requests by reference on the
// embedded server, every client dialed with durallm.DataConverter over a
// result directory, in one run:
//
//   - history-bytes/action-1KB, -1MB, -20MB: the history of one action
//     started with the Go client, by request size (target: under 64 KB
//     whatever the size);
//   - history-bytes/action-1MB-inline, ms/action-1MB-inline,
//     cpu-ms/action-1MB-inline and 1MB-inline/1KB-time: the 1 MB action
//     on a worker and client without the converter (every payload in
//     history), the comparison;
//   - ms/action-1KB, -1MB, -20MB: start to result, one action after
//     another, the sizes alternating, and 1MB/1KB-time, the ratio of the
//     first two (target: at most 1.5); cpu-ms/action-* and 1MB/1KB-cpu,
//     the same in the process's CPU (server, worker, client and provider
//     all live in it), which a busy machine disturbs less than time;
//   - parent-bytes/turn: the history of a user's agent workflow calling
//     step once a turn, 30 turns, its conversation growing by 50 KB a
//     turn (to 1.5 MB), per turn; parent-bytes/turn-1-10 and -21-30 are
//     its first and last ten turns (target: under 4 KB, and flat).
//
// Each iteration runs one action of each size and the inline one. The
// requests are a long document's text (prose), built before the clock
// starts.
//
//	go test -run '^$' -bench BenchmarkRequestsByReference -benchtime 10x ./internal/e2e/
func BenchmarkRequestsByReference(b *testing.B) {
	ts := temporaltest.NewServer(temporaltest.WithBaseServerOptions(devserver.TemporaltestOption()))
	b.Cleanup(ts.Stop)
	store := resultstore.Dir{Path: filepath.Join(b.TempDir(), "results")}
	dc := durallm.DataConverter(store)
	tc := ts.NewClientWithOptions(client.Options{DataConverter: dc})
	p, err := providertest.NewProvider()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	p.SetDefault(providertest.Answer("noted"))
	startBenchWorker(b, tc, p, "durallm-bench", store)
	c := durallm.NewClient(tc, "durallm-bench").WithResults(store).WithDataConverter(dc)
	// The same stack without the converter, on a task queue of its own:
	// every payload inline, as before requests went by reference.
	plainTC := ts.GetDefaultClient()
	startBenchWorker(b, plainTC, p, "durallm-bench-inline", nil)
	inline := durallm.NewClient(plainTC, "durallm-bench-inline")
	ctx := context.Background()
	requests := map[int]workflows.ActionInput{}
	for _, n := range []int{1 << 10, 1 << 20, 20 << 20} {
		requests[n] = workflows.ActionInput{Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", prose(n))}}, Routes: []string{"bench"}}
	}
	runOn := func(c *durallm.Client, tc client.Client, id string, n int) (took, cpu time.Duration, hist int) {
		in := requests[n]
		start, cpu0 := time.Now(), processCPU(b)
		a, err := c.Start(ctx, id, in)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.Result(ctx); err != nil {
			b.Fatal(err)
		}
		took, cpu = time.Since(start), processCPU(b)-cpu0
		hist, _, _ = historyBytes(b, tc, id)
		return took, cpu, hist
	}
	run := func(id string, n int) (time.Duration, time.Duration, int) { return runOn(c, tc, id, n) }
	sizes := []struct {
		name string
		n    int
	}{{"1KB", 1 << 10}, {"1MB", 1 << 20}, {"20MB", 20 << 20}}
	for i := range 3 { // warm-up, unmeasured
		run(fmt.Sprintf("warm-%d", i), 1<<10)
		run(fmt.Sprintf("warm-big-%d", i), 1<<20)
	}
	took, cpu := map[string]time.Duration{}, map[string]time.Duration{}
	hist := map[string]int{}
	b.ResetTimer()
	for i := range b.N {
		for _, s := range sizes {
			d, c, h := run(fmt.Sprintf("byref-%s-%d", s.name, i), s.n)
			took[s.name] += d
			cpu[s.name] += c
			hist[s.name] += h
		}
		d, c, h := runOn(inline, plainTC, fmt.Sprintf("inline-1MB-%d", i), 1<<20)
		took["1MB-inline"] += d
		cpu["1MB-inline"] += c
		hist["1MB-inline"] += h
	}
	b.StopTimer()
	for _, size := range []string{"1KB", "1MB", "20MB", "1MB-inline"} {
		b.ReportMetric(float64(hist[size])/float64(b.N), "history-bytes/action-"+size)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	for _, size := range []string{"1KB", "1MB", "20MB", "1MB-inline"} {
		b.ReportMetric(ms(took[size]), "ms/action-"+size)
		b.ReportMetric(ms(cpu[size]), "cpu-ms/action-"+size)
	}
	b.ReportMetric(float64(took["1MB"])/float64(took["1KB"]), "1MB/1KB-time")
	b.ReportMetric(float64(cpu["1MB"])/float64(cpu["1KB"]), "1MB/1KB-cpu")
	b.ReportMetric(float64(took["1MB-inline"])/float64(took["1KB"]), "1MB-inline/1KB-time")

	// The agent, once.
	const turns = 30
	q := "bench-parents"
	pw := sdkworker.New(tc, q, sdkworker.Options{})
	pw.RegisterWorkflow(growingAgent)
	if err := pw.Start(); err != nil {
		b.Fatal(err)
	}
	defer pw.Stop()
	ar, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "agent", TaskQueue: q}, growingAgent, agentIn{Turns: turns, Growth: 50 << 10, Queue: "durallm-bench"})
	if err != nil {
		b.Fatal(err)
	}
	var done int
	if err := ar.Get(ctx, &done); err != nil || done != turns {
		b.Fatalf("agent: %d turns, %v", done, err)
	}
	perTurn := make([]int, turns+1) // [0]: before the first call
	turn := 0
	_, _, events := historyBytes(b, tc, "agent")
	for _, ev := range events {
		if ev.GetEventType() == enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED {
			fmt.Sscanf(strings.TrimPrefix(ev.GetStartChildWorkflowExecutionInitiatedEventAttributes().GetWorkflowId(), "agent-turn-"), "%d", &turn)
		}
		perTurn[turn] += proto.Size(ev)
	}
	sum := func(from, to int) (n int) {
		for _, v := range perTurn[from : to+1] {
			n += v
		}
		return n
	}
	b.ReportMetric(float64(sum(0, turns))/turns, "parent-bytes/turn")
	b.ReportMetric(float64(sum(1, 10))/10, "parent-bytes/turn-1-10")
	b.ReportMetric(float64(sum(21, 30))/10, "parent-bytes/turn-21-30")
}
