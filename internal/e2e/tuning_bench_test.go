package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// BenchmarkEmbeddedServerTuning runs the same happy-path actions (16 in
// flight) against the file-backed embedded server ('durallm dev') under
// SQLite's and the SDK's defaults, then with each setting that is ours to
// tune, then with all of them. It reports actions/s and p50/p99.
//
//	go test -run '^$' -bench BenchmarkEmbeddedServerTuning -benchtime 300x ./internal/e2e/
func BenchmarkEmbeddedServerTuning(b *testing.B) {
	type tuning struct {
		name    string
		pragmas map[string]string
		eager   bool
		pollers int
		noEager bool // eager activities off
	}
	untunedSQLite := map[string]string{"journal_mode": "", "synchronous": ""}
	for _, tc := range []tuning{
		{name: "untuned", pragmas: untunedSQLite, noEager: true},
		{name: "sqlite-wal", noEager: true},
		{name: "eager-activities", pragmas: untunedSQLite},
		{name: "eager-start", pragmas: untunedSQLite, eager: true, noEager: true},
		{name: "pollers-8", pragmas: untunedSQLite, pollers: 8, noEager: true},
		{name: "all", eager: true, pollers: 8},
	} {
		b.Run(tc.name, func(b *testing.B) {
			st := newServerStack(b, func(o *devserver.Options) { o.SQLitePragmas = tc.pragmas }, worker.Options{
				TaskQueue: "tune", WorkflowPollers: tc.pollers, ActivityPollers: tc.pollers, DisableEagerActivities: tc.noEager,
			})
			tcl := st.tc
			c := durallm.NewClient(tcl, "tune")
			if tc.eager {
				c.WithEagerStart()
			}
			var seq atomic.Int64
			run := func(ctx context.Context) error {
				a, err := c.Start(ctx, fmt.Sprintf("t-%d", seq.Add(1)), workflows.ActionInput{
					Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}},
					Routes:  []string{"r"},
				})
				if err != nil {
					return err
				}
				_, err = a.Result(ctx)
				return err
			}
			if err := run(context.Background()); err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			lat := make([]time.Duration, 0, b.N)
			var next atomic.Int64
			var wg sync.WaitGroup
			profilePath, stopProfile := startLatencyProfile(b)
			cpu0 := processCPU(b)
			b.ResetTimer()
			start := time.Now()
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						t0 := time.Now()
						if err := run(context.Background()); err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						lat = append(lat, time.Since(t0))
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			cpu := processCPU(b) - cpu0
			stopProfile()
			b.ReportMetric(ms(cpu/time.Duration(b.N)), "cpu-ms/op")
			if profilePath != "" {
				reportCPUBreakdown(b, profilePath, b.N)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "actions/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
