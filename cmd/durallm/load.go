package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// loadReport is what 'durallm load' measured: the steady-state runs only
// (the warm-up is left out).
type loadReport struct {
	Actions     int     `json:"actions"`
	Concurrency int     `json:"concurrency"`
	Failed      int     `json:"failed"` // runs that did not end completed
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"actions_per_second"`
	P50ms       float64 `json:"p50_ms"`
	P90ms       float64 `json:"p90_ms"`
	P99ms       float64 `json:"p99_ms"`
	CPUms       float64 `json:"client_cpu_ms_per_action"` // this process's own
}

// runLoad drives happy actions from this process against a running worker
// and reports throughput and start-to-result latency: the measurement of
// docs/performance.md "Concurrency 16 from another process".
func runLoad(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("load", "--route NAME [--actions 400] [--concurrency 16] [flags]", stderr)
	var cf connFlags
	cf.register(fs)
	var routes listFlag
	fs.Var(&routes, "route", "route names in order (repeatable or comma-separated)")
	actions := fs.Int("actions", 400, "actions to measure")
	concurrency := fs.Int("concurrency", 16, "actions in flight at once, each caller starting the next when its last ends")
	warmup := fs.Int("warmup", 20, "actions run first and left out of the numbers")
	message := fs.String("message", "hi", "the user message of every action")
	prefix := fs.String("id-prefix", "", "action id prefix (default: load-<time>-)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if len(routes) == 0 || *actions < 1 || *concurrency < 1 || *warmup < 0 {
		fmt.Fprintln(stderr, "durallm load: --route is required; --actions and --concurrency must be at least 1")
		return exitUsage
	}
	if *prefix == "" {
		*prefix = "load-" + time.Now().UTC().Format("20060102-150405") + "-"
	}
	tc, err := cf.dial()
	if err != nil {
		fmt.Fprintf(stderr, "durallm load: %v\n", err)
		return exitError
	}
	defer tc.Close()
	c := cf.client(tc)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	in := workflows.ActionInput{Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", *message)}}, Routes: routes}

	l := &loader{c: c, in: in, prefix: *prefix}
	if *warmup > 0 {
		if _, _, err := l.run(ctx, *warmup, *concurrency); err != nil {
			fmt.Fprintf(stderr, "durallm load: warm-up: %v\n", err)
			return exitError
		}
	}
	cpu0 := ownCPU()
	t0 := time.Now()
	lat, failed, err := l.run(ctx, *actions, *concurrency)
	elapsed := time.Since(t0)
	cpu := ownCPU() - cpu0
	if err != nil {
		fmt.Fprintf(stderr, "durallm load: %v\n", err)
		return exitError
	}
	slices.Sort(lat)
	pct := func(p int) float64 {
		return float64(lat[min(len(lat)-1, len(lat)*p/100)].Microseconds()) / 1000
	}
	r := loadReport{
		Actions: len(lat), Concurrency: *concurrency, Failed: failed,
		Seconds: elapsed.Seconds(), PerSecond: float64(len(lat)) / elapsed.Seconds(),
		P50ms: pct(50), P90ms: pct(90), P99ms: pct(99),
		CPUms: float64(cpu.Microseconds()) / 1000 / float64(len(lat)),
	}
	if cf.jsonOut {
		b, _ := json.Marshal(r)
		fmt.Fprintln(stdout, string(b))
	} else {
		fmt.Fprintf(stdout, "%d actions at concurrency %d in %.1fs: %.1f actions/s; start to result p50 %.1f ms, p90 %.1f ms, p99 %.1f ms; %d not completed; this client's CPU %.2f ms per action\n",
			r.Actions, r.Concurrency, r.Seconds, r.PerSecond, r.P50ms, r.P90ms, r.P99ms, r.Failed, r.CPUms)
	}
	if failed > 0 {
		return exitError
	}
	return exitOK
}

// loader starts actions for 'durallm load', numbering their ids across
// runs.
type loader struct {
	c      *durallm.Client
	in     workflows.ActionInput
	prefix string

	mu  sync.Mutex
	seq int
}

// run starts n actions with conc callers and returns each one's
// start-to-result latency and how many did not complete.
func (l *loader) run(ctx context.Context, n, conc int) ([]time.Duration, int, error) {
	lat := make([]time.Duration, 0, n)
	var failed int
	var firstErr error
	var wg sync.WaitGroup
	next := make(chan string)
	go func() {
		defer close(next)
		for range n {
			l.mu.Lock()
			l.seq++
			id := fmt.Sprintf("%s%d", l.prefix, l.seq)
			l.mu.Unlock()
			select {
			case next <- id:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				t0 := time.Now()
				a, err := l.c.Start(ctx, id, l.in)
				if err == nil {
					var res workflows.ActionResult
					res, err = a.Result(ctx)
					if err == nil && res.State != workflows.StateCompleted {
						l.mu.Lock()
						failed++
						l.mu.Unlock()
					}
				}
				d := time.Since(t0)
				l.mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				lat = append(lat, d)
				l.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return lat, failed, firstErr
}

// ownCPU is this process's user+system CPU so far.
func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
