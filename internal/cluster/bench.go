package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// BenchOptions bound a benchmark. Zero values take the defaults named.
type BenchOptions struct {
	// Concurrency levels. Default 1, 16, 64.
	Concurrency []int
	// Actions per level: at least this many, and 4 per caller. Default 200.
	Actions int
	// Warmup actions before each server's first level. Default 20.
	Warmup int
	// Progress receives a line per level.
	Progress io.Writer
}

// BenchRow is one server at one concurrency.
type BenchRow struct {
	Server      string
	Concurrency int
	Actions     int
	PerSecond   float64
	P50, P99    time.Duration
}

func (o BenchOptions) withDefaults() BenchOptions {
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 16, 64}
	}
	if o.Actions <= 0 {
		o.Actions = 200
	}
	if o.Warmup <= 0 {
		o.Warmup = 20
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// BenchEmbedded measures the embedded default ('durallm dev': the
// SQLite-backed server in this process and an in-process worker) against
// p, answering at once, in dir.
func BenchEmbedded(ctx context.Context, dir string, p *providertest.Provider, o BenchOptions) ([]BenchRow, error) {
	o = o.withDefaults()
	srv, err := devserver.Start(ctx, devserver.Options{
		DataDir: filepath.Join(dir, "embedded"), FrontendPort: devserver.FreePort, DisableUI: true,
		SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: bench: %w", err)
	}
	defer srv.Stop()
	tc, err := client.DialContext(ctx, client.Options{HostPort: srv.FrontendHostPort(), Namespace: srv.Namespace(), Logger: telemetry.TemporalLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		return nil, fmt.Errorf("cluster: bench: %w", err)
	}
	defer tc.Close()
	var rs []routes.Route
	for _, name := range routeNames {
		rs = append(rs, routes.Route{Name: name, Kind: routes.KindOpenAI, BaseURL: p.H2CURL() + "/v1", Model: "m", Capabilities: providers.Capabilities{Streaming: true}})
	}
	w, err := worker.New(tc, worker.Options{TaskQueue: TaskQueue, AllowH2C: true, SearchAttributes: true, Logger: slog.New(slog.DiscardHandler), Config: routes.Config{Routes: rs}})
	if err != nil {
		return nil, err
	}
	if err := w.Start(); err != nil {
		return nil, err
	}
	defer w.Stop()
	return benchLevels(ctx, "embedded (SQLite, 1 process, in-process worker)", durallm.NewClient(tc, TaskQueue), o)
}

// Bench measures the cluster; c should run with DirectProvider and a
// provider that answers at once, like BenchEmbedded's.
func Bench(ctx context.Context, c *Cluster, o BenchOptions) ([]BenchRow, error) {
	o = o.withDefaults()
	dc, tc, err := c.Client(ctx)
	if err != nil {
		return nil, err
	}
	defer tc.Close()
	name := fmt.Sprintf("cluster (PostgreSQL, %d nodes, %d shards, %d worker processes, via haproxy)", len(c.Nodes), c.shards(), len(c.Workers))
	return benchLevels(ctx, name, dc, o)
}

func benchLevels(ctx context.Context, server string, dc *durallm.Client, o BenchOptions) ([]BenchRow, error) {
	prefix := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := measure(ctx, dc, prefix+"-warmup", min(4, o.Warmup), o.Warmup); err != nil {
		return nil, err
	}
	var rows []BenchRow
	for _, conc := range o.Concurrency {
		n := max(o.Actions, 4*conc)
		row, err := measure(ctx, dc, fmt.Sprintf("%s-c%d", prefix, conc), conc, n)
		if err != nil {
			return nil, err
		}
		row.Server = server
		fmt.Fprintf(o.Progress, "· %s c=%d: %.1f actions/s, p50 %s, p99 %s\n", server, conc, row.PerSecond, row.P50.Round(time.Millisecond), row.P99.Round(time.Millisecond))
		rows = append(rows, row)
	}
	return rows, nil
}

// measure runs n actions, conc at a time, each from its start to its
// result.
func measure(ctx context.Context, dc *durallm.Client, prefix string, conc, n int) (BenchRow, error) {
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t := time.Now()
				in := workflows.ActionInput{
					Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "bench")}},
					Routes:  routeNames[:1],
				}
				a, err := dc.Start(ctx, prefix+"-"+strconv.Itoa(i), in)
				if err == nil {
					_, err = a.Result(ctx)
				}
				lat[i], errs[i] = time.Since(t), err
			}
		}()
	}
	start := time.Now()
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	for i, err := range errs {
		if err != nil {
			return BenchRow{}, fmt.Errorf("cluster: bench action %s-%d: %w", prefix, i, err)
		}
	}
	return BenchRow{Concurrency: conc, Actions: n, PerSecond: float64(n) / elapsed.Seconds(), P50: percentile(lat, 0.50), P99: percentile(lat, 0.99)}, nil
}

// PrintBench writes the rows as a table.
func PrintBench(w io.Writer, rows []BenchRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "server\tconcurrency\tactions\tactions/s\tp50\tp99")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%s\t%s\n", r.Server, r.Concurrency, r.Actions, r.PerSecond, r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond))
	}
	tw.Flush()
}
