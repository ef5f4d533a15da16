package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/durallm/durallm/providers/routes"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/temporaltest"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// minimalWorkflow is the baseline: the smallest workflow that runs one
// activity, with the same retry rule as CallModel.
func minimalWorkflow(ctx workflow.Context, in string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var out string
	err := workflow.ExecuteActivity(ctx, noopActivity, in).Get(ctx, &out)
	return out, err
}

func noopActivity(_ context.Context, in string) (string, error) { return in, nil }

// benchStack is an embedded server, the providertest provider and a durallm
// worker with one route ("bench") to it, plus a baseline worker on its own
// task queue registered by baseline. Everything stops with the benchmark.
type benchStack struct {
	tc client.Client
	p  *providertest.Provider
	w  *worker.Worker
	c  *durallm.Client
}

func newBenchStack(b *testing.B, baseline func(sdkworker.Registry)) *benchStack {
	b.Helper()
	ts := temporaltest.NewServer(temporaltest.WithBaseServerOptions(devserver.TemporaltestOption()))
	b.Cleanup(ts.Stop)
	tc := ts.GetDefaultClient()
	p, err := providertest.NewProvider()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	base := ts.NewWorker("baseline", baseline)
	b.Cleanup(base.Stop)
	w := startBenchWorker(b, tc, p, "durallm-bench", nil)
	return &benchStack{tc: tc, p: p, w: w, c: durallm.NewClient(tc, "durallm-bench")}
}

// startBenchWorker starts a durallm worker on tc polling queue, with one
// route ("bench") to p and results (nil: none) as its result store; it
// stops with the benchmark.
func startBenchWorker(b *testing.B, tc client.Client, p *providertest.Provider, queue string, results resultstore.Store) *worker.Worker {
	b.Helper()
	w, err := worker.New(tc, worker.Options{
		TaskQueue: queue, TLS: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler), Results: results,
		Config: routes.Config{Routes: []routes.Route{{Name: "bench", Kind: routes.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m"}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Stop)
	return w
}

// start starts a one-message action on the bench route.
func (s *benchStack) start(ctx context.Context, id string) (*durallm.Action, error) {
	return s.c.Start(ctx, id, workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}},
		Routes:  []string{"bench"},
	})
}

// reportLatency reports p50 and p99 of lat in milliseconds.
func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkDurableOverhead compares a happy-path LLMAction (one attempt
// against a provider that answers at once) with the smallest one-activity
// workflow, on the same embedded Temporal server, in the same run, at
// concurrency 1, 16 and 64. It reports actions/s and p50/p99 latency
// (start to result).
//
//	go test -run '^$' -bench BenchmarkDurableOverhead -benchtime 200x .
func BenchmarkDurableOverhead(b *testing.B) {
	s := newBenchStack(b, func(r sdkworker.Registry) {
		r.RegisterWorkflow(minimalWorkflow)
		r.RegisterActivity(noopActivity)
	})
	tc := s.tc
	var seq atomic.Int64
	kinds := []struct {
		name string
		run  func(ctx context.Context) error
	}{
		{"baseline", func(ctx context.Context) error {
			id := fmt.Sprintf("base-%d", seq.Add(1))
			run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "baseline"}, minimalWorkflow, "x")
			if err != nil {
				return err
			}
			return run.Get(ctx, nil)
		}},
		{"action", func(ctx context.Context) error {
			a, err := s.start(ctx, fmt.Sprintf("act-%d", seq.Add(1)))
			if err != nil {
				return err
			}
			_, err = a.Result(ctx)
			return err
		}},
	}
	for _, conc := range []int{1, 16, 64} {
		for _, k := range kinds {
			b.Run(fmt.Sprintf("c=%d/%s", conc, k.name), func(b *testing.B) {
				ctx := context.Background()
				if err := k.run(ctx); err != nil { // warm caches and connections
					b.Fatal(err)
				}
				lat := make([]time.Duration, 0, b.N)
				var mu sync.Mutex
				var next atomic.Int64
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							t0 := time.Now()
							if err := k.run(ctx); err != nil {
								b.Error(err)
								return
							}
							d := time.Since(t0)
							mu.Lock()
							lat = append(lat, d)
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				if len(lat) == 0 {
					return
				}
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "actions/s")
				reportLatency(b, lat)
			})
		}
	}
}

// flakyOnce fails the first call of each id, then succeeds: the baseline
// for a blind retry.
var flakyOnce sync.Map

func flakyActivity(_ context.Context, id string) (string, error) {
	if _, seen := flakyOnce.LoadOrStore(id, true); !seen {
		return "", errors.New("transient failure")
	}
	return id, nil
}

// blindRetryWorkflow is what a gateway without evidence does: any failure
// is retried by Temporal after a fixed 1 s backoff.
func blindRetryWorkflow(ctx workflow.Context, id string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumAttempts: 3},
	})
	var out string
	err := workflow.ExecuteActivity(ctx, flakyActivity, id).Get(ctx, &out)
	return out, err
}

// BenchmarkRecoveryCost measures what recovering from a GOAWAY above the
// boundary adds to an action, against a clean action and against a blind
// retry with a 1 s backoff, sequentially on the same embedded server. It
// reports latency and, per action, the connections the engine opened and
// the attempts dispatched.
//
//	go test -run '^$' -bench BenchmarkRecoveryCost -benchtime 30x .
func BenchmarkRecoveryCost(b *testing.B) {
	s := newBenchStack(b, func(r sdkworker.Registry) {
		r.RegisterWorkflow(blindRetryWorkflow)
		r.RegisterActivity(flakyActivity)
	})
	tc, p, w := s.tc, s.p, s.w
	var seq atomic.Int64
	action := func(ctx context.Context, fault bool) (workflows.ActionResult, error) {
		if fault {
			p.Push(providertest.GoAwayAbove(http2.ErrCodeNo))
		}
		a, err := s.start(ctx, fmt.Sprintf("rc-%d", seq.Add(1)))
		if err != nil {
			return workflows.ActionResult{}, err
		}
		return a.Result(ctx)
	}
	cases := []struct {
		name string
		run  func(ctx context.Context) (attempts int, err error)
	}{
		{"clean", func(ctx context.Context) (int, error) {
			res, err := action(ctx, false)
			return res.Used, err
		}},
		{"goaway-recovered", func(ctx context.Context) (int, error) {
			res, err := action(ctx, true)
			return res.Used, err
		}},
		{"blind-retry-1s", func(ctx context.Context) (int, error) {
			id := fmt.Sprintf("blind-%d", seq.Add(1))
			run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "baseline"}, blindRetryWorkflow, id)
			if err != nil {
				return 0, err
			}
			return 2, run.Get(ctx, nil)
		}},
	}
	for _, k := range cases {
		b.Run(k.name, func(b *testing.B) {
			ctx := context.Background()
			if _, err := k.run(ctx); err != nil { // warm up
				b.Fatal(err)
			}
			conns0 := w.Engine().Stats().ConnsOpened
			attempts := 0
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				n, err := k.run(ctx)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
				attempts += n
			}
			b.StopTimer()
			reportLatency(b, lat)
			b.ReportMetric(float64(w.Engine().Stats().ConnsOpened-conns0)/float64(b.N), "conns/action")
			b.ReportMetric(float64(attempts)/float64(b.N), "attempts/action")
		})
	}
}

// BenchmarkHistoryCost reports the history events and bytes one action
// costs for the happy path, a GOAWAY retry, a fallback and a
// reconciliation, at 1 and at 20 actions in flight, to show the cost per
// action stays flat as load grows. No timing is reported.
//
//	go test -run '^$' -bench BenchmarkHistoryCost -benchtime 20x .
func BenchmarkHistoryCost(b *testing.B) {
	s := newBenchStack(b, func(sdkworker.Registry) {})
	kinds := []struct {
		name  string
		first func() providertest.Behavior
		after func(ctx context.Context, id string) error
	}{
		{"happy", nil, nil},
		{"goaway-retry", func() providertest.Behavior { return providertest.GoAwayAbove(http2.ErrCodeNo) }, nil},
		{"upstream-error-retry", func() providertest.Behavior { return providertest.ServerError(500) }, nil},
		{"reconciliation", func() providertest.Behavior { return providertest.GoAwayAfterProcessing(http2.ErrCodeNo) }, func(ctx context.Context, id string) error {
			// Reconcile every ambiguous attempt (under load, another action's
			// GOAWAY can make a second one ambiguous too) until the end.
			deadline := time.Now().Add(time.Minute)
			for time.Now().Before(deadline) {
				st, err := s.c.Status(ctx, id)
				switch {
				case err != nil:
				case st.State.Terminal():
					return nil
				case st.State == workflows.StateAwaitingReconciliation:
					if err := s.c.Reconcile(ctx, id, workflows.ReconcileRequest{Attempt: st.AwaitingAttempt, Verdict: "not_executed"}); err != nil {
						return err
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			return errors.New("never finished")
		}},
	}
	// The fault goes to each action's first request, by idempotency key
	// (the action id), whatever else is in flight.
	var faultsMu sync.Mutex
	faults := map[string]func() providertest.Behavior{}
	s.p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		faultsMu.Lock()
		defer faultsMu.Unlock()
		f, ok := faults[r.IdempotencyKey]
		if !ok {
			return providertest.Behavior{}, false
		}
		delete(faults, r.IdempotencyKey)
		return f(), true
	})
	var seq atomic.Int64
	for _, conc := range []int{1, 20} {
		for _, k := range kinds {
			b.Run(fmt.Sprintf("c=%d/%s", conc, k.name), func(b *testing.B) {
				ctx := context.Background()
				var events, bytes atomic.Int64
				var wg sync.WaitGroup
				var next atomic.Int64
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							id := fmt.Sprintf("hc-%d", seq.Add(1))
							if k.first != nil {
								faultsMu.Lock()
								faults[id] = k.first
								faultsMu.Unlock()
							}
							a, err := s.start(ctx, id)
							if err != nil {
								b.Error(err)
								return
							}
							if k.after != nil {
								if err := k.after(ctx, id); err != nil {
									b.Error(err)
									return
								}
							}
							if _, err := a.Result(ctx); err != nil {
								b.Error(err)
								return
							}
							iter := s.tc.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
							for iter.HasNext() {
								ev, err := iter.Next()
								if err != nil {
									b.Error(err)
									return
								}
								events.Add(1)
								bytes.Add(int64(proto.Size(ev)))
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(events.Load())/float64(b.N), "events/action")
				b.ReportMetric(float64(bytes.Load())/float64(b.N), "history-bytes/action")
			})
		}
	}
}

// BenchmarkWorkerMemory measures the resident memory of a durallm worker
// process (a subprocess, so the embedded server's memory is not counted)
// with 100 and then 1,000 actions in flight, each attempt held open by
// the provider, and the increment per action between the two.
//
//	go test -run '^$' -bench BenchmarkWorkerMemory -benchtime 1x .
func BenchmarkWorkerMemory(b *testing.B) {
	for range b.N {
		ts := temporaltest.NewServer(temporaltest.WithBaseServerOptions(devserver.TemporaltestOption()))
		tc := ts.GetDefaultClient()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if _, err := tc.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
			Namespace: ts.GetDefaultNamespace(), SearchAttributes: workflows.SearchAttributes,
		}); err != nil {
			b.Fatal(err)
		}
		p, err := providertest.NewProvider(providertest.WithMaxConcurrentStreams(400))
		if err != nil {
			b.Fatal(err)
		}
		p.SetDefault(providertest.Hold())
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorkerProcess$")
		cmd.Env = append(os.Environ(), "DURALLM_HELPER_WORKER=1",
			"DURALLM_HELPER_TEMPORAL="+ts.GetFrontendHostPort(), "DURALLM_HELPER_NAMESPACE="+ts.GetDefaultNamespace(),
			"DURALLM_HELPER_QUEUE=mem", "DURALLM_HELPER_PROVIDER="+p.H2CURL(), "DURALLM_HELPER_MAX_ATTEMPTS=1100")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		c := durallm.NewClient(tc, "mem")
		started := 0
		var rss [2]float64
		for i, level := range []int{100, 1000} {
			var wg sync.WaitGroup
			ids := make(chan int)
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := range ids {
						if _, err := c.Start(ctx, fmt.Sprintf("mem-%d", n), workflows.ActionInput{
							Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hold")}},
							Routes:  []string{"primary"}, AttemptTimeout: 4 * time.Minute,
						}); err != nil {
							b.Error(err)
						}
					}
				}()
			}
			for ; started < level; started++ {
				ids <- started
			}
			close(ids)
			wg.Wait()
			for len(p.Processed()) < level {
				if ctx.Err() != nil {
					b.Fatalf("only %d of %d attempts in flight", len(p.Processed()), level)
				}
				time.Sleep(100 * time.Millisecond)
			}
			time.Sleep(2 * time.Second) // let the worker settle before reading
			rss[i] = residentMiB(b, cmd.Process.Pid)
		}
		b.ReportMetric(rss[0], "rss-MiB@100")
		b.ReportMetric(rss[1], "rss-MiB@1000")
		b.ReportMetric((rss[1]-rss[0])*1024/900, "KiB/action")
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		cancel()
		p.Close()
		ts.Stop()
	}
}

func residentMiB(b *testing.B, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
