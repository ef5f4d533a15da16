package fleetlimit_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durallm/durallm/fleetlimit"
	"github.com/durallm/durallm/providers/routes"
)

// The cost of a take from the shared store: one round trip to
// PostgreSQL on loopback, a function call that locks the route's row.
// docs/performance.md has the figures.
//
//	go test ./fleetlimit -run '^$' -bench . -benchtime 2000x
func BenchmarkPostgresTake(b *testing.B) {
	p, err := fleetlimit.OpenPostgres(context.Background(), pg.FreshDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	l := fleetlimit.Limits{RequestsPerMinute: 1e9, TokensPerMinute: 1e12}
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if _, err := p.Take(ctx, "r", "h", l, fleetlimit.Ask{Requests: 1, Tokens: 100}); err != nil {
			b.Fatal(err)
		}
	}
}

// Four stores (four workers' pools) taking from one route's row at once:
// the row lock serializes them.
func BenchmarkPostgresTakeFourWorkers(b *testing.B) {
	dsn := pg.FreshDSN()
	stores := make([]*fleetlimit.Postgres, 4)
	for i := range stores {
		p, err := fleetlimit.OpenPostgres(context.Background(), dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		stores[i] = p
	}
	l := fleetlimit.Limits{RequestsPerMinute: 1e9, TokensPerMinute: 1e12}
	ctx := context.Background()
	var next int
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		next++
		p := stores[next%len(stores)]
		for pb.Next() {
			if _, err := p.Take(ctx, "r", "h", l, fleetlimit.Ask{Requests: 1, Tokens: 100}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// An attempt with room on hand: what a worker adds to an attempt that
// does not have to wait.
func BenchmarkAcquireWithRoomOnHand(b *testing.B) {
	p, err := fleetlimit.OpenPostgres(context.Background(), pg.FreshDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	lim := fleetlimit.New(fleetlimit.Options{Store: p, Routes: map[string]routes.Limits{"r": {RequestsPerMinute: 6_000_000, TokensPerMinute: 600_000_000}}})
	defer lim.Close()
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		g, err := lim.Acquire(ctx, "r", 100, 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		g.Release(true, 60, true)
	}
}

// Four workers' limiters on one database, their callers each asking for
// room for an attempt that counts `reserve` tokens before it is sent and
// uses `used` (the provider's count, which settles it), against a tokens
// per minute limit that binds: the grants over the run, against what
// the limit admits (a full bucket and the refill, at `used` a request).
// It reports the ratio over the whole run, and the rate of grants over
// its second half against the limit's (T / used): what is given back
// must reach the other workers, or the fleet runs at reserve's pace
// instead of used's. The difference between the two is what the waiting
// attempts hold beyond what they will use, callers × (reserve − used).
//
//	go test ./fleetlimit -run '^$' -bench TokensSettle -benchtime 1x
func BenchmarkTokensSettleAcrossWorkers(b *testing.B) {
	const tpm, reserve, used, workers, callers = 6000, 109, 35, 4, 16
	const run = 20 * time.Second
	dsn := pg.FreshDSN()
	lims := make([]*fleetlimit.Limiter, workers)
	for i := range lims {
		p, err := fleetlimit.OpenPostgres(context.Background(), dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		lims[i] = fleetlimit.New(fleetlimit.Options{Store: p, Routes: map[string]routes.Limits{"r": {TokensPerMinute: tpm}}})
		defer lims[i].Close()
	}
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), run)
		var granted, half atomic.Int64
		time.AfterFunc(run/2, func() { half.Store(granted.Load()) })
		var wg sync.WaitGroup
		for _, lim := range lims {
			for range callers {
				wg.Go(func() {
					for ctx.Err() == nil {
						g, err := lim.Acquire(ctx, "r", reserve, time.Hour, nil)
						if err != nil {
							return
						}
						granted.Add(1)
						time.Sleep(time.Millisecond) // the exchange
						g.Release(true, used, true)
					}
				})
			}
		}
		wg.Wait()
		cancel()
		allowed := float64(tpm) * (1 + run.Minutes()) / used
		b.ReportMetric(float64(granted.Load())/allowed, "granted/allowed")
		b.ReportMetric(float64(granted.Load()-half.Load())/((run/2).Minutes()*tpm/used), "second-half-rate/limit")
	}
}
