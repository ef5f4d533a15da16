package fleetlimit_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/durallm/durallm/fleetlimit"
	"github.com/durallm/durallm/internal/pgserver"
)

// pg is one real PostgreSQL server for the whole test binary; each test
// gets a database of its own on it.
var pg *pgserver.Server

func TestMain(m *testing.M) { os.Exit(pgserver.ForTests(m, &pg)) }

func openPostgres(t *testing.T, dsn string) *fleetlimit.Postgres {
	t.Helper()
	p, err := fleetlimit.OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// stores are the two stores, each fresh per test: the same arithmetic
// in Go and in SQL, held to the same cases.
var stores = []struct {
	name string
	open func(t *testing.T) fleetlimit.Store
}{
	{"memory", func(*testing.T) fleetlimit.Store { return &fleetlimit.Memory{} }},
	{"postgres", func(t *testing.T) fleetlimit.Store { return openPostgres(t, pg.FreshDSN()) }},
}

// The cases use limits slow enough (a few a minute) that the refill
// while a case runs never changes what it sees.
func TestStores(t *testing.T) {
	ctx := context.Background()
	take := func(t *testing.T, s fleetlimit.Store, key string, l fleetlimit.Limits, a fleetlimit.Ask) fleetlimit.Taken {
		t.Helper()
		got, err := s.Take(ctx, key, "h1", l, a)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	between := func(t *testing.T, what string, d, lo, hi time.Duration) {
		t.Helper()
		if d < lo || d > hi {
			t.Fatalf("%s = %v, want between %v and %v", what, d, lo, hi)
		}
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			// At 6 a minute, the arrival lag a full bucket is charged
			// once it is left is a tenth of a request: five at once, and
			// the sixth a second later.
			t.Run("a full bucket grants its minute's worth less the arrival lag, then refuses a take that cannot wait", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{RequestsPerMinute: 6}
				for i := range 5 {
					if got := take(t, s, "r", l, fleetlimit.Ask{Requests: 1}); got.Wait != 0 || got.Refused {
						t.Fatalf("take %d: %+v", i+1, got)
					}
				}
				got := take(t, s, "r", l, fleetlimit.Ask{Requests: 1})
				if !got.Refused || got.Limit != fleetlimit.LimitRequests {
					t.Fatalf("sixth take %+v", got)
				}
				between(t, "its wait", got.Wait, 500*time.Millisecond, time.Second)
			})
			t.Run("waiters queue in debt, each told its own wait", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{RequestsPerMinute: 6}
				for range 5 {
					take(t, s, "r", l, fleetlimit.Ask{Requests: 1})
				}
				first := take(t, s, "r", l, fleetlimit.Ask{Requests: 1, MaxWait: time.Hour})
				second := take(t, s, "r", l, fleetlimit.Ask{Requests: 1, MaxWait: time.Hour})
				if first.Refused || second.Refused || first.Limit != fleetlimit.LimitRequests {
					t.Fatalf("takes %+v, %+v", first, second)
				}
				between(t, "first wait", first.Wait, 500*time.Millisecond, time.Second)
				between(t, "second wait", second.Wait, 10500*time.Millisecond, 11*time.Second)
			})
			t.Run("extras come out of what is free, and never while anyone waits", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{RequestsPerMinute: 6, TokensPerMinute: 600}
				got := take(t, s, "r", l, fleetlimit.Ask{Requests: 1, Tokens: 100, ExtraRequests: 3, ExtraTokens: 1000})
				if got.ExtraRequests != 3 || got.ExtraTokens != 500 {
					t.Fatalf("extras %+v, want 3 requests and the 500 tokens left", got)
				}
				take(t, s, "r", l, fleetlimit.Ask{Requests: 2, MaxWait: time.Hour}) // into debt
				if got := take(t, s, "r", l, fleetlimit.Ask{ExtraRequests: 5, ExtraTokens: 5}); got.ExtraRequests != 0 || got.ExtraTokens != 0 {
					t.Fatalf("an extras-only take while others wait: %+v", got)
				}
			})
			t.Run("tokens", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{TokensPerMinute: 60}
				take(t, s, "r", l, fleetlimit.Ask{Requests: 1, Tokens: 40})
				got := take(t, s, "r", l, fleetlimit.Ask{Requests: 1, Tokens: 40})
				if !got.Refused || got.Limit != fleetlimit.LimitTokens {
					t.Fatalf("take %+v", got)
				}
				// 19 left (60, less 40, less the lag's 1): 21 short at 1 a second.
				between(t, "its wait", got.Wait, 20500*time.Millisecond, 21*time.Second)
			})
			t.Run("slots", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{MaxConcurrent: 2}
				for i := range 2 {
					if got := take(t, s, "r", l, fleetlimit.Ask{Slot: true}); !got.Slot {
						t.Fatalf("slot %d: %+v", i+1, got)
					}
				}
				if got := take(t, s, "r", l, fleetlimit.Ask{Slot: true, MaxWait: time.Hour}); got.Slot || !got.Refused || got.Limit != fleetlimit.LimitConcurrency {
					t.Fatalf("third slot %+v", got)
				}
				if err := s.Give(ctx, "r", "h1", l, 0, 0, 1); err != nil {
					t.Fatal(err)
				}
				if got := take(t, s, "r", l, fleetlimit.Ask{Slot: true}); !got.Slot {
					t.Fatalf("a slot given back is not taken again: %+v", got)
				}
			})
			t.Run("what is given back is taken again, up to a minute's worth", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{RequestsPerMinute: 6}
				for range 5 {
					take(t, s, "r", l, fleetlimit.Ask{Requests: 1})
				}
				if err := s.Give(ctx, "r", "h1", l, 2, 0, 0); err != nil {
					t.Fatal(err)
				}
				if got := take(t, s, "r", l, fleetlimit.Ask{Requests: 2}); got.Refused || got.Wait != 0 {
					t.Fatalf("take of what was given back %+v", got)
				}
				if got := take(t, s, "r", l, fleetlimit.Ask{Requests: 1}); !got.Refused {
					t.Fatalf("took more than was given back: %+v", got)
				}
				if err := s.Give(ctx, "r", "h1", l, 100, 0, 0); err != nil {
					t.Fatal(err)
				}
				take(t, s, "r", l, fleetlimit.Ask{Requests: 5})
				if got := take(t, s, "r", l, fleetlimit.Ask{Requests: 1}); !got.Refused {
					t.Fatalf("a give beyond a minute's worth raised the bucket past it: %+v", got)
				}
			})
			t.Run("a provider's pushback holds everyone", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{RequestsPerMinute: 600, TokensPerMinute: 60000}
				if err := s.Tighten(ctx, "r", l, fleetlimit.Pushback{RetryAfter: 30 * time.Second, KnownRetryAfter: true}); err != nil {
					t.Fatal(err)
				}
				got := take(t, s, "r", l, fleetlimit.Ask{Requests: 1})
				if !got.Refused || got.Limit != fleetlimit.LimitPushback {
					t.Fatalf("take after a Retry-After %+v", got)
				}
				between(t, "its wait", got.Wait, 29*time.Second, 30*time.Second)

				if err := s.Tighten(ctx, "other", l, fleetlimit.Pushback{RemainingRequests: 0, KnownRemainingRequests: true, RemainingTokens: 50, KnownRemainingTokens: true}); err != nil {
					t.Fatal(err)
				}
				got = take(t, s, "other", l, fleetlimit.Ask{Requests: 1, Tokens: 10})
				if !got.Refused || got.Limit != fleetlimit.LimitRequests {
					t.Fatalf("take after remaining 0 %+v", got)
				}
				between(t, "its wait", got.Wait, 90*time.Millisecond, 100*time.Millisecond)
				if got := take(t, s, "other", l, fleetlimit.Ask{Tokens: 60}); !got.Refused || got.Limit != fleetlimit.LimitTokens {
					t.Fatalf("take of more tokens than remain %+v", got)
				}
			})
			t.Run("room given back moves a waiter sooner, room taken away later", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{TokensPerMinute: 60}
				take(t, s, "r", l, fleetlimit.Ask{Tokens: 60}) // empty, and the lag's 1 owed
				at := time.Now()
				waiter := take(t, s, "r", l, fleetlimit.Ask{Tokens: 30, MaxWait: time.Hour})
				between(t, "the waiter's wait", waiter.Wait, 30*time.Second, 31*time.Second)
				if err := s.Give(ctx, "r", "h1", l, 0, 20, 0); err != nil {
					t.Fatal(err)
				}
				m, err := s.Mark(ctx, "r")
				if err != nil {
					t.Fatal(err)
				}
				between(t, "its wait once 20 were given back", waiter.Moved(l, at, m).Sub(at), 10*time.Second, 11*time.Second)
				if err := s.Tighten(ctx, "r", l, fleetlimit.Pushback{RetryAfter: time.Minute, KnownRetryAfter: true}); err != nil {
					t.Fatal(err)
				}
				if m, err = s.Mark(ctx, "r"); err != nil {
					t.Fatal(err)
				}
				between(t, "its wait once a provider holds the route a minute", waiter.Moved(l, at, m).Sub(at), 59*time.Second, 61*time.Second)
				if m, err := s.Mark(ctx, "unknown"); err != nil || m != (fleetlimit.Mark{}) {
					t.Fatalf("the mark of buckets never made: %+v, %v", m, err)
				}
			})
			t.Run("routes keep buckets of their own", func(t *testing.T) {
				s := st.open(t)
				l := fleetlimit.Limits{RequestsPerMinute: 1}
				take(t, s, "a", l, fleetlimit.Ask{Requests: 1})
				if got := take(t, s, "b", l, fleetlimit.Ask{Requests: 1}); got.Refused {
					t.Fatalf("b took a's: %+v", got)
				}
			})
		})
	}
}

// A worker that dies holding slots frees them when its lease runs out;
// one that renews keeps them; and a give from a holder whose lease ran
// out never frees another holder's slot.
func TestPostgresLeases(t *testing.T) {
	ctx := context.Background()
	dsn := pg.FreshDSN()
	p := openPostgres(t, dsn)
	p.Lease = 500 * time.Millisecond
	l := fleetlimit.Limits{MaxConcurrent: 1}
	mustTake := func(holder string, want bool) {
		t.Helper()
		got, err := p.Take(ctx, "r", holder, l, fleetlimit.Ask{Slot: true})
		if err != nil {
			t.Fatal(err)
		}
		if got.Slot != want {
			t.Fatalf("%s took a slot: %v, want %v", holder, got.Slot, want)
		}
	}
	mustTake("dead", true)
	mustTake("alive", false)
	time.Sleep(700 * time.Millisecond) // the dead holder's lease runs out
	mustTake("alive", true)
	// The dead holder's late give must not free alive's slot.
	if err := p.Give(ctx, "r", "dead", l, 0, 0, 1); err != nil {
		t.Fatal(err)
	}
	mustTake("third", false)

	// A holder that renews keeps its slot past the lease.
	for range 3 {
		time.Sleep(300 * time.Millisecond)
		if err := p.Renew(ctx, "r", "alive", l, 1); err != nil {
			t.Fatal(err)
		}
	}
	mustTake("third", false)
	// A renewal after the lease ran out counts the slot again.
	time.Sleep(700 * time.Millisecond)
	if err := p.Renew(ctx, "r", "alive", l, 1); err != nil {
		t.Fatal(err)
	}
	mustTake("third", false)
	if err := p.Give(ctx, "r", "alive", l, 0, 0, 1); err != nil {
		t.Fatal(err)
	}
	mustTake("third", true)
}
