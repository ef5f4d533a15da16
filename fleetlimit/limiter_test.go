package fleetlimit_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durallm/durallm/fleetlimit"
	"github.com/durallm/durallm/providers/routes"
)

func newLimiter(t *testing.T, s fleetlimit.Store, l routes.Limits) *fleetlimit.Limiter {
	t.Helper()
	lim := fleetlimit.New(fleetlimit.Options{Store: s, Routes: map[string]routes.Limits{"r": l}})
	t.Cleanup(lim.Close)
	return lim
}

func TestARouteWithoutLimitsIsGrantedNothing(t *testing.T) {
	lim := newLimiter(t, nil, routes.Limits{RequestsPerMinute: 1})
	if lim.Limited("other") || !lim.Limited("r") {
		t.Fatal("Limited is wrong")
	}
	g, err := lim.Acquire(context.Background(), "other", 100, 0, nil)
	if g != nil || err != nil {
		t.Fatalf("Acquire on a route without limits = %+v, %v", g, err)
	}
	g.Release(true, 0, false) // a nil grant releases nothing
}

func TestAnAttemptWithRoomIsGrantedWithoutWaiting(t *testing.T) {
	lim := newLimiter(t, nil, routes.Limits{RequestsPerMinute: 600, TokensPerMinute: 60000, MaxConcurrentRequests: 4})
	g, err := lim.Acquire(context.Background(), "r", 500, 0, func(string) { t.Error("told to wait") })
	if err != nil || g == nil || g.Limit != "" {
		t.Fatalf("Acquire = %+v, %v", g, err)
	}
	g.Release(true, 300, true)
}

// An attempt whose wait would pass what it can afford is refused at once,
// told how long the limit expects, and takes nothing; an attempt given
// back unsent returns its room.
func TestNoRoomWithinTheWaitTakesNothing(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, routes.Limits{RequestsPerMinute: 1})
	g, err := lim.Acquire(ctx, "r", 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lim.Acquire(ctx, "r", 0, 10*time.Second, nil)
	var nr *fleetlimit.NoRoomError
	if !errors.As(err, &nr) || !errors.Is(err, fleetlimit.ErrNoRoom) || nr.Limit != fleetlimit.LimitRequests || nr.In < 50*time.Second || nr.Route != "r" {
		t.Fatalf("second Acquire: %v (%+v)", err, nr)
	}
	g.Release(false, 0, false) // never sent
	// Given back, the next attempt waits at most the arrival lag the
	// first take charged, not the minute a spent bucket would need.
	if _, err := lim.Acquire(ctx, "r", 0, 10*time.Second, nil); err != nil {
		t.Fatalf("the room of an unsent attempt was not given back: %v", err)
	}
}

// An attempt whose scope ends while it waits returns at once, sends
// nothing, and gives back what it took.
func TestAWaitCutShortGivesBackWhatItTook(t *testing.T) {
	lim := newLimiter(t, nil, routes.Limits{RequestsPerMinute: 1})
	if _, err := lim.Acquire(context.Background(), "r", 0, 0, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var told string
	_, err := lim.Acquire(ctx, "r", 0, time.Hour, func(limit string) { told = limit; cancel() })
	if !errors.Is(err, context.Canceled) || told != fleetlimit.LimitRequests {
		t.Fatalf("Acquire = %v, told %q", err, told)
	}
	// What the canceled wait took is back: a bucket one request into debt
	// would make the next attempt wait two minutes; it waits one.
	_, err = lim.Acquire(context.Background(), "r", 0, 0, nil)
	var nr *fleetlimit.NoRoomError
	if !errors.As(err, &nr) || nr.In > 61*time.Second {
		t.Fatalf("after the canceled wait: %v", err)
	}
}

func TestAPlaceInFlightIsWaitedFor(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, routes.Limits{MaxConcurrentRequests: 1})
	g1, err := lim.Acquire(ctx, "r", 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Acquire(ctx, "r", 0, 0, nil); !errors.Is(err, fleetlimit.ErrNoRoom) {
		t.Fatalf("a second place with no wait allowed: %v", err)
	}
	waiting := make(chan string, 1)
	got := make(chan *fleetlimit.Grant)
	go func() {
		g, err := lim.Acquire(ctx, "r", 0, time.Hour, func(limit string) { waiting <- limit })
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	if limit := <-waiting; limit != fleetlimit.LimitConcurrency {
		t.Fatalf("waiting for %q", limit)
	}
	g1.Release(true, 0, false)
	if g2 := <-got; g2 == nil || g2.Limit != fleetlimit.LimitConcurrency {
		t.Fatalf("second grant %+v", g2)
	}
}

func TestAProvidersRetryAfterHoldsTheRoute(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, routes.Limits{RequestsPerMinute: 6000})
	lim.Pushback(ctx, "r", fleetlimit.Pushback{RetryAfter: time.Hour, KnownRetryAfter: true})
	_, err := lim.Acquire(ctx, "r", 0, time.Minute, nil)
	var nr *fleetlimit.NoRoomError
	if !errors.As(err, &nr) || nr.Limit != fleetlimit.LimitPushback || nr.In < 59*time.Minute {
		t.Fatalf("Acquire after a Retry-After of an hour: %v", err)
	}
}

// Several limiters, each a process of its own, on one database: what they
// are granted together never passes the limit, and the places in flight
// never pass theirs.
func TestLimitersSharingPostgresHoldOneLimit(t *testing.T) {
	dsn := pg.FreshDSN()
	const rpm, workers, callers = 240, 4, 6
	t.Run("requests per minute", func(t *testing.T) {
		lims := make([]*fleetlimit.Limiter, workers)
		for i := range lims {
			lims[i] = newLimiter(t, openPostgres(t, dsn), routes.Limits{RequestsPerMinute: rpm})
		}
		var granted atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for _, lim := range lims {
			for range callers {
				wg.Go(func() {
					// Each caller asks until it has been refused ten times
					// in a row: the bucket is spent.
					for refused := 0; refused < 10; {
						g, err := lim.Acquire(context.Background(), "r", 0, 0, nil)
						if err != nil {
							if !errors.Is(err, fleetlimit.ErrNoRoom) {
								t.Error(err)
								return
							}
							refused++
							continue
						}
						refused = 0
						granted.Add(1)
						g.Release(true, 0, false)
					}
				})
			}
		}
		wg.Wait()
		// A minute's worth at the start, and the refill since.
		bound := rpm + int64(math.Ceil(time.Since(start).Minutes()*rpm))
		if n := granted.Load(); n > bound || n < rpm/2 {
			t.Fatalf("granted %d together; the limit allows at most %d (and they got at least half of it)", n, bound)
		}
		t.Logf("granted %d of at most %d", granted.Load(), bound)
	})
	t.Run("requests in flight", func(t *testing.T) {
		const places = 3
		lims := make([]*fleetlimit.Limiter, workers)
		for i := range lims {
			lims[i] = newLimiter(t, openPostgres(t, dsn), routes.Limits{MaxConcurrentRequests: places})
		}
		var inFlight, most, done atomic.Int64
		var wg sync.WaitGroup
		for _, lim := range lims {
			for range callers {
				wg.Go(func() {
					for range 5 {
						g, err := lim.Acquire(context.Background(), "r", 0, time.Minute, nil)
						if err != nil {
							t.Error(err)
							return
						}
						n := inFlight.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						time.Sleep(2 * time.Millisecond)
						inFlight.Add(-1)
						g.Release(true, 0, false)
						done.Add(1)
					}
				})
			}
		}
		wg.Wait()
		if most.Load() > places || done.Load() != workers*callers*5 {
			t.Fatalf("%d in flight at most (limit %d), %d done", most.Load(), places, done.Load())
		}
	})
}
