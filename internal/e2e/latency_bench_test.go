package e2e_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// oneActivityWorkflow is the smallest workflow with one activity.
func oneActivityWorkflow(ctx workflow.Context, in string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var out string
	err := workflow.ExecuteActivity(ctx, echoActivity, in).Get(ctx, &out)
	return out, err
}

func echoActivity(_ context.Context, in string) (string, error) { return in, nil }

// latencyCPUProfile, when set, is a directory: each sub-benchmark of
// BenchmarkSequentialLatency and BenchmarkEmbeddedServerTuning writes the
// process's CPU profile of its measured runs only (not the server's start
// or the warm-up) there, named after the sub-benchmark, and reports it
// broken down as cpu-<bucket>-ms/op metrics (cpuBuckets). See
// docs/performance.md, "Where the CPU of an action goes".
var latencyCPUProfile = flag.String("latency.cpuprofile", "", "directory for CPU profiles of the latency and tuning benchmarks' measured runs")

// latencyWarmup runs are left out of every measurement: the first few
// actions after a start ride on full token buckets and warm caches, and
// the question is the steady state.
const latencyWarmup = 10

// BenchmarkSequentialLatency is one caller starting an action and waiting
// for its result, then the next (concurrency 1), against the file-backed
// embedded server with 'durallm dev's worker wiring (8 pollers each, eager
// activities on, no eager start: the caller is another process). It runs
// the smallest one-activity workflow and a happy LLMAction against the
// testsuite provider, and reports start-to-result p50/p90/p99 after
// latencyWarmup unmeasured runs, plus, read from each run's history:
//
//   - wft-wait-p50-ms: the run's workflow tasks' scheduled-to-started
//     gaps added up (time a task sat between history and a poller);
//   - wft-run-p50-ms: their started-to-completed times added up (the
//     worker running the workflow code and the server taking its answer);
//   - work-p50-ms: its activity's started-to-completed time, the work
//     itself (for LLMAction, the CallModel attempt), the floor;
//   - server-p50-ms: started event to completed event;
//   - start-lead-p50-ms: the call to start until the started event;
//   - result-lag-p50-ms: the completed event until the result is back;
//   - cpu-ms/op: the process's user+system CPU per run (server, worker
//     and caller all live in it).
//
// "embedded" is the embedded server as shipped; "server-default" puts back
// the server's default for history.transferProcessorMaxPollRPS (20, see
// devDynamicConfig) and nothing else. The other rows test what that limit
// predicts: every transfer task on the critical path costs one 50 ms
// token, so eager workflow start (the first workflow task skips the
// transfer queue) should save one quantum and eager activities off (the
// activity takes the queue too) should add one.
//
//	go test -run '^$' -bench BenchmarkSequentialLatency -benchtime 200x ./internal/e2e/
//
// In "embedded" and "embedded+eager-start", gateway-json is the same
// happy action as a non-streamed POST /v1/chat/completions to durallm's
// gateway with its worker in its process (the client shared, eager
// start), and gateway-json-worker-elsewhere through a gateway with a
// Temporal client of its own and the worker in another process ('durallm
// gateway --worker=false'); compare the first with llmaction under eager
// start, the second with llmaction without it. gateway-messages-json and
// gateway-responses-json are gateway-json's request as a non-streamed
// POST /v1/messages and POST /v1/responses to the same gateway.
//
// "embedded+gzip" and "embedded+payload-stats" each put back one of the
// CPU cuts of docs/performance.md "Where the CPU of an action goes": the
// SDK's default gzip on the client's gRPC, and the server's default
// history.externalPayloadsEnabled; "before-cpu-cuts" puts back both.
func BenchmarkSequentialLatency(b *testing.B) {
	serverDefault := map[string]any{"history.transferProcessorMaxPollRPS": nil}
	payloadStats := map[string]any{"history.externalPayloadsEnabled": nil}
	for _, v := range []struct {
		name       string
		dc         map[string]any
		eagerStart bool // the first workflow task comes back with the start
		noEagerAct bool // the activity goes through a transfer task too
		gzip       bool // the SDK's default gRPC compression
		noCache    bool // SQLite without the devserver's statement cache
		devWiring  bool // the worker as 'durallm dev' wires it (telemetry, journal, result store)
		gateway    bool // add the gateway's rows
	}{
		{name: "embedded", gateway: true},
		{name: "embedded-no-statement-cache", noCache: true},
		{name: "embedded+dev-wiring", devWiring: true},
		{name: "embedded+gzip", gzip: true},
		{name: "embedded+payload-stats", dc: payloadStats},
		{name: "before-cpu-cuts", dc: payloadStats, gzip: true},
		{name: "server-default", dc: serverDefault},
		{name: "server-default+eager-start", dc: serverDefault, eagerStart: true},
		{name: "server-default-no-eager-activities", dc: serverDefault, noEagerAct: true},
		{name: "embedded+eager-start", eagerStart: true, gateway: true},
	} {
		b.Run(v.name, func(b *testing.B) {
			wo := worker.Options{TaskQueue: "lat", WorkflowPollers: 8, ActivityPollers: 8, DisableEagerActivities: v.noEagerAct}
			if v.devWiring {
				tel, err := telemetry.New(slog.New(slog.DiscardHandler))
				if err != nil {
					b.Fatal(err)
				}
				dir := b.TempDir()
				wo.Telemetry = tel
				wo.Journal = journal.Dir{Path: filepath.Join(dir, "journal"), Bound: &journal.Bound{MaxBytes: 1 << 30}}
				wo.Results = resultstore.Dir{Path: filepath.Join(dir, "results")}
			}
			st := newServerStack(b, func(o *devserver.Options) { o.DynamicConfig, o.NoStatementCache = v.dc, v.noCache }, wo, func(o *client.Options) {
				if v.gzip {
					o.ConnectionOptions.GrpcCompression = &client.GrpcCompressionGzip{}
				}
			})
			tcl := st.tc
			bw := sdkworker.New(tcl, "lat-base", sdkworker.Options{MaxConcurrentWorkflowTaskPollers: 8, MaxConcurrentActivityTaskPollers: 8, DisableEagerActivities: v.noEagerAct})
			bw.RegisterWorkflow(oneActivityWorkflow)
			bw.RegisterActivity(echoActivity)
			if err := bw.Start(); err != nil {
				b.Fatal(err)
			}
			defer bw.Stop()
			c := durallm.NewClient(tcl, "lat")
			if v.eagerStart {
				c.WithEagerStart()
			}

			var seq int
			type row struct {
				name string
				// run makes one run and returns the id of the workflow
				// it ran.
				run func(ctx context.Context, id string) (string, error)
			}
			rows := []row{
				{"one-activity", func(ctx context.Context, id string) (string, error) {
					run, err := tcl.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "lat-base", EnableEagerStart: v.eagerStart}, oneActivityWorkflow, "x")
					if err != nil {
						return id, err
					}
					return id, run.Get(ctx, nil)
				}},
				{"llmaction", func(ctx context.Context, id string) (string, error) {
					a, err := c.Start(ctx, id, workflows.ActionInput{
						Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}},
						Routes:  []string{"r"},
					})
					if err != nil {
						return id, err
					}
					_, err = a.Result(ctx)
					return id, err
				}},
			}
			if v.gateway {
				// A non-streamed request through durallm's gateway, its
				// worker in its process ('durallm gateway': the client
				// shared, eager start) and elsewhere (--worker=false: a
				// client of its own).
				local := newBenchGateway(b, durallm.NewClient(tcl, "lat").WithEagerStart(), st.w.Streams(), false)
				startWorkerProcess(b, st, "lat-elsewhere")
				elsewhere := newBenchGateway(b, elsewhereClient(b, st, "lat-elsewhere"), nil, true)
				rows = append(rows,
					row{"gateway-json", func(ctx context.Context, _ string) (string, error) { return local.json(ctx) }},
					row{"gateway-messages-json", func(ctx context.Context, _ string) (string, error) { return local.jsonOf(ctx, messagesAPI) }},
					row{"gateway-responses-json", func(ctx context.Context, _ string) (string, error) { return local.jsonOf(ctx, responsesAPI) }},
					row{"gateway-json-worker-elsewhere", func(ctx context.Context, _ string) (string, error) { return elsewhere.json(ctx) }})
			}
			for _, k := range rows {
				b.Run(k.name, func(b *testing.B) {
					ctx := context.Background()
					next := func() string { seq++; return fmt.Sprintf("%s-%d", k.name, seq) }
					for range latencyWarmup {
						if _, err := k.run(ctx, next()); err != nil {
							b.Fatal(err)
						}
					}
					lat := make([]time.Duration, 0, b.N)
					ids := make([]string, 0, b.N)
					starts, ends := make([]time.Time, 0, b.N), make([]time.Time, 0, b.N)
					profilePath, stopProfile := startLatencyProfile(b)
					cpu0 := processCPU(b)
					b.ResetTimer()
					for range b.N {
						t0 := time.Now()
						id, err := k.run(ctx, next())
						if err != nil {
							b.Fatal(err)
						}
						t1 := time.Now()
						lat = append(lat, t1.Sub(t0))
						ids = append(ids, id)
						starts, ends = append(starts, t0), append(ends, t1)
					}
					b.StopTimer()
					cpu := processCPU(b) - cpu0
					stopProfile()
					var events int
					var wait, run, work, server, lead, lag []time.Duration
					for i, id := range ids {
						h, err := historyTimes(ctx, tcl, id)
						if err != nil {
							b.Fatal(err)
						}
						events += h.events
						wait, run = append(wait, h.wftWait), append(run, h.wftRun)
						work, server = append(work, h.work), append(server, h.completed.Sub(h.started))
						lead, lag = append(lead, h.started.Sub(starts[i])), append(lag, ends[i].Sub(h.completed))
					}
					reportPercentiles(b, "", lat)
					logSlowest(ctx, b, tcl, ids, lat, starts)
					b.ReportMetric(ms(percentile(wait, 50)), "wft-wait-p50-ms")
					b.ReportMetric(ms(percentile(run, 50)), "wft-run-p50-ms")
					b.ReportMetric(ms(percentile(work, 50)), "work-p50-ms")
					b.ReportMetric(ms(percentile(server, 50)), "server-p50-ms")
					b.ReportMetric(ms(percentile(lead, 50)), "start-lead-p50-ms")
					b.ReportMetric(ms(percentile(lag, 50)), "result-lag-p50-ms")
					b.ReportMetric(ms(cpu/time.Duration(b.N)), "cpu-ms/op")
					b.ReportMetric(float64(events)/float64(b.N), "events/op")
					if profilePath != "" {
						reportCPUBreakdown(b, profilePath, b.N)
					}
				})
			}
		})
	}
}

// startLatencyProfile starts the CPU profile -latency.cpuprofile asks for
// and returns its path ("" for none) and what stops it.
func startLatencyProfile(b *testing.B) (path string, stop func()) {
	if *latencyCPUProfile == "" {
		return "", func() {}
	}
	path = filepath.Join(*latencyCPUProfile, strings.NewReplacer("/", "_", "+", "_").Replace(b.Name())+".pprof")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return path, func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}
}

// processCPU is the user+system CPU this process (server, worker and
// caller alike) has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runTimes are durations read from one run's history.
type runTimes struct {
	wftWait time.Duration // workflow tasks' scheduled-to-started gaps, summed
	wftRun  time.Duration // workflow tasks' started-to-completed, summed
	work    time.Duration // activity started to completed
	events  int           // history events
	// started and completed are the execution's first and last events.
	started, completed time.Time
}

func historyTimes(ctx context.Context, c client.Client, id string) (runTimes, error) {
	var t runTimes
	var wftScheduled, wftStarted, actStarted time.Time
	it := c.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return t, err
		}
		t.events++
		at := e.GetEventTime().AsTime()
		switch e.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
			t.started = at
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
			wftScheduled = at
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED:
			wftStarted = at
			t.wftWait += at.Sub(wftScheduled)
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
			t.wftRun += at.Sub(wftStarted)
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
			actStarted = at
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
			t.work += at.Sub(actStarted)
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
			t.completed = at
		}
	}
	return t, nil
}

// logSlowest logs the slowest run's history as offsets from its start
// call, when it took over a second: the p99 is where a stall shows, and
// its events say which hop it was.
func logSlowest(ctx context.Context, b *testing.B, c client.Client, ids []string, lat []time.Duration, starts []time.Time) {
	i := 0
	for j := range lat {
		if lat[j] > lat[i] {
			i = j
		}
	}
	if lat[i] < time.Second {
		return
	}
	var lines []string
	it := c.GetWorkflowHistory(ctx, ids[i], "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			b.Logf("slowest run %s: reading its history: %v", ids[i], err)
			return
		}
		lines = append(lines, fmt.Sprintf("%8.1f ms %s", ms(e.GetEventTime().AsTime().Sub(starts[i])), e.GetEventType()))
	}
	b.Logf("slowest run %s took %v: %s", ids[i], lat[i], strings.Join(lines, "; "))
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// reportPercentiles reports p50, p90 and p99 of lat in milliseconds.
func reportPercentiles(b *testing.B, prefix string, lat []time.Duration) {
	for _, p := range []int{50, 90, 99} {
		b.ReportMetric(ms(percentile(lat, p)), fmt.Sprintf("%sp%d-ms", prefix, p))
	}
}
