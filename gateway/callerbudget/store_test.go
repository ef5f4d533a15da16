package callerbudget_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/gateway/callerbudget"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/workflows"
)

// pg is one real PostgreSQL server for the whole test binary; each test
// gets a database of its own on it.
var pg *pgserver.Server

func TestMain(m *testing.M) { os.Exit(pgserver.ForTests(m, &pg)) }

// backend opens a store; again opens another on the same data, as a
// second gateway (Postgres) or the same one restarted (File) would.
type backend struct {
	name string
	open func(t *testing.T) (first callerbudget.Store, again func() callerbudget.Store)
}

var backends = []backend{
	{"file", func(t *testing.T) (callerbudget.Store, func() callerbudget.Store) {
		path := filepath.Join(t.TempDir(), "spend.json")
		open := func() callerbudget.Store {
			f, err := callerbudget.OpenFile(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}
		first := open()
		return first, func() callerbudget.Store { first.Close(); return open() }
	}},
	{"postgres", func(t *testing.T) (callerbudget.Store, func() callerbudget.Store) {
		dsn := pg.FreshDSN()
		open := func() callerbudget.Store {
			p, err := callerbudget.OpenPostgres(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			return p
		}
		return open(), open
	}},
}

const period = "day@2026-12-02T00:00:00Z"

func ask(id string, limit workflows.Budget, least, want workflows.Spend) callerbudget.Ask {
	return callerbudget.Ask{ActionID: id, Caller: "team-a", Period: period, Limit: limit, Least: least, Want: want}
}

func reserve(t *testing.T, s callerbudget.Store, a callerbudget.Ask) callerbudget.Reservation {
	t.Helper()
	r, err := s.Reserve(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func settle(t *testing.T, s callerbudget.Store, id string, charged workflows.Spend) (callerbudget.Hold, bool) {
	t.Helper()
	h, ok, err := s.Settle(context.Background(), id, charged)
	if err != nil {
		t.Fatal(err)
	}
	return h, ok
}

func account(t *testing.T, s callerbudget.Store) callerbudget.Account {
	t.Helper()
	a, err := s.Account(context.Background(), "team-a", period)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestStores(t *testing.T) {
	tokens := workflows.Budget{Tokens: 1000}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Run("a reservation holds what it wants while the limit leaves it, and what is left when that is less", func(t *testing.T) {
				s, _ := b.open(t)
				if r := reserve(t, s, ask("a1", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 400})); !r.OK || r.Held.Tokens != 400 {
					t.Fatalf("first: %+v", r)
				}
				if r := reserve(t, s, ask("a2", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 800})); !r.OK || r.Held.Tokens != 600 {
					t.Fatalf("second, with 600 left: %+v", r)
				}
				if a := account(t, s); a.Held.Tokens != 1000 || a.Settled.Tokens != 0 {
					t.Fatalf("account %+v", a)
				}
			})
			t.Run("a request whose one worst case does not fit what is left is refused and holds nothing", func(t *testing.T) {
				s, _ := b.open(t)
				reserve(t, s, ask("a1", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 950}))
				r := reserve(t, s, ask("a2", tokens, workflows.Spend{Tokens: 51}, workflows.Spend{Tokens: 200}))
				if r.OK || r.Short != workflows.WhyTokenBudget {
					t.Fatalf("refusal %+v", r)
				}
				if a := account(t, s); a.Held.Tokens != 950 {
					t.Fatalf("the refusal held something: %+v", a)
				}
			})
			t.Run("a cost limit refuses by cost and holds cost only", func(t *testing.T) {
				s, _ := b.open(t)
				cost := workflows.Budget{Cost: 1}
				r := reserve(t, s, ask("a1", cost, workflows.Spend{Tokens: 5000, Cost: 0.25}, workflows.Spend{Tokens: 20000, Cost: 0.75}))
				if !r.OK || r.Held != (workflows.Spend{Cost: 0.75}) {
					t.Fatalf("first %+v", r)
				}
				if r := reserve(t, s, ask("a2", cost, workflows.Spend{Cost: 0.3}, workflows.Spend{Cost: 0.3})); r.OK || r.Short != workflows.WhyCostBudget {
					t.Fatalf("second %+v", r)
				}
			})
			t.Run("settling releases the hold and charges what the action committed, once", func(t *testing.T) {
				s, _ := b.open(t)
				reserve(t, s, ask("a1", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 800}))
				h, ok := settle(t, s, "a1", workflows.Spend{Tokens: 120, Cost: 0.5})
				if !ok || h.Caller != "team-a" || h.Period != period || h.Spend.Tokens != 800 {
					t.Fatalf("settled %+v %v", h, ok)
				}
				if _, again := settle(t, s, "a1", workflows.Spend{Tokens: 120}); again {
					t.Fatal("a second settle found the hold")
				}
				if a := account(t, s); a.Held != (workflows.Spend{}) || a.Settled != (workflows.Spend{Tokens: 120, Cost: 0.5}) {
					t.Fatalf("account %+v", a)
				}
				if r := reserve(t, s, ask("a2", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 2000})); !r.OK || r.Held.Tokens != 880 {
					t.Fatalf("after the settle: %+v", r)
				}
			})
			t.Run("the same action reserving again gets its hold and takes nothing more", func(t *testing.T) {
				s, _ := b.open(t)
				reserve(t, s, ask("a1", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 300}))
				r := reserve(t, s, ask("a1", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 300}))
				if !r.OK || !r.Existing || r.Held.Tokens != 300 {
					t.Fatalf("again %+v", r)
				}
				if a := account(t, s); a.Held.Tokens != 300 {
					t.Fatalf("account %+v", a)
				}
			})
			t.Run("periods and callers are accounts of their own", func(t *testing.T) {
				s, _ := b.open(t)
				reserve(t, s, ask("a1", tokens, workflows.Spend{Tokens: 1000}, workflows.Spend{Tokens: 1000}))
				next := ask("a2", tokens, workflows.Spend{Tokens: 1000}, workflows.Spend{Tokens: 1000})
				next.Period = "day@2026-12-03T00:00:00Z"
				if r := reserve(t, s, next); !r.OK {
					t.Fatalf("the next day %+v", r)
				}
				other := ask("a3", tokens, workflows.Spend{Tokens: 1000}, workflows.Spend{Tokens: 1000})
				other.Caller = "team-b"
				if r := reserve(t, s, other); !r.OK {
					t.Fatalf("another caller %+v", r)
				}
			})
			t.Run("the accounts and holds outlive the store: another opened on the same data sees them", func(t *testing.T) {
				s, again := b.open(t)
				reserve(t, s, ask("a1", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 300}))
				reserve(t, s, ask("a2", tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 300}))
				settle(t, s, "a1", workflows.Spend{Tokens: 50})
				s2 := again()
				if a := account(t, s2); a.Settled.Tokens != 50 || a.Held.Tokens != 300 {
					t.Fatalf("account seen again %+v", a)
				}
				holds, err := s2.Holds(context.Background(), time.Now().Add(time.Minute), 10)
				if err != nil || len(holds) != 1 || holds[0].ActionID != "a2" || holds[0].Spend.Tokens != 300 {
					t.Fatalf("holds seen again %+v %v", holds, err)
				}
				if r := reserve(t, s2, ask("a3", tokens, workflows.Spend{Tokens: 651}, workflows.Spend{Tokens: 651})); r.OK {
					t.Fatalf("past the limit after reopening: %+v", r)
				}
			})
			t.Run("holds lists the holds made before a time, oldest first, up to its limit", func(t *testing.T) {
				s, _ := b.open(t)
				for _, id := range []string{"a1", "a2", "a3"} {
					reserve(t, s, ask(id, tokens, workflows.Spend{Tokens: 10}, workflows.Spend{Tokens: 10}))
					time.Sleep(2 * time.Millisecond) // distinct times of making
				}
				if holds, err := s.Holds(context.Background(), time.Now().Add(-time.Hour), 10); err != nil || len(holds) != 0 {
					t.Fatalf("holds made before an hour ago: %+v %v", holds, err)
				}
				holds, err := s.Holds(context.Background(), time.Now().Add(time.Minute), 2)
				if err != nil || len(holds) != 2 || holds[0].ActionID != "a1" || holds[1].ActionID != "a2" {
					t.Fatalf("holds %+v %v", holds, err)
				}
			})
			t.Run("reservations at once never take more than the limit together", func(t *testing.T) {
				s, again := b.open(t)
				stores := []callerbudget.Store{s}
				if b.name == "postgres" {
					stores = append(stores, again()) // a second gateway
				}
				var wg sync.WaitGroup
				var mu sync.Mutex
				held := int64(0)
				for i := range 20 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r, err := stores[i%len(stores)].Reserve(context.Background(), ask("c"+string(rune('a'+i)), tokens, workflows.Spend{Tokens: 100}, workflows.Spend{Tokens: 100}))
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						held += r.Held.Tokens
						mu.Unlock()
					}()
				}
				wg.Wait()
				if a := account(t, s); held != 1000 || a.Held.Tokens != 1000 {
					t.Fatalf("held %d together, the account says %+v; want the limit, 1000", held, a)
				}
			})
		})
	}
}

func TestASpendFileServesOneProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spend.json")
	f, err := callerbudget.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := callerbudget.OpenFile(path); !errors.Is(err, callerbudget.ErrFileInUse) {
		t.Fatalf("a second open: %v, want ErrFileInUse", err)
	}
}

func TestParsePeriod(t *testing.T) {
	at := time.Date(2026, 12, 2, 8, 53, 0, 0, time.UTC)
	for _, c := range []struct {
		in, key string
		end     time.Time
	}{
		{"day", "day@2026-12-02T00:00:00Z", time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)},
		{"month", "month@2026-12-01T00:00:00Z", time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"6h", "6h0m0s@2026-12-02T06:00:00Z", time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)},
	} {
		p, err := callerbudget.ParsePeriod(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if key, end := p.Of(at); key != c.key || !end.Equal(c.end) {
			t.Fatalf("%s: %s until %v, want %s until %v", c.in, key, end, c.key, c.end)
		}
	}
	for _, bad := range []string{"", "week", "30s", "-1h", "9000h", "0"} {
		if _, err := callerbudget.ParsePeriod(bad); err == nil {
			t.Errorf("period %q accepted", bad)
		}
	}
}

// The spend file keeps a caller's current period and those that still
// hold: a reservation in a new period forgets the ended ones, so the
// file stays small however short the period.
func TestASpendFileForgetsEndedPeriodsThatHoldNothing(t *testing.T) {
	f, err := callerbudget.OpenFile(filepath.Join(t.TempDir(), "spend.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tokens := workflows.Budget{Tokens: 1000}
	day := func(id, period string) callerbudget.Ask {
		a := ask(id, tokens, workflows.Spend{Tokens: 10}, workflows.Spend{Tokens: 10})
		a.Period = period
		return a
	}
	reserve(t, f, day("d1", "day@2026-12-01T00:00:00Z"))
	settle(t, f, "d1", workflows.Spend{Tokens: 7})
	reserve(t, f, day("d2", "day@2026-12-02T00:00:00Z"))
	reserve(t, f, day("d3", "day@2026-12-03T00:00:00Z"))
	ctx := context.Background()
	if a, _ := f.Account(ctx, "team-a", "day@2026-12-01T00:00:00Z"); a != (callerbudget.Account{}) {
		t.Fatalf("an ended period that holds nothing is kept: %+v", a)
	}
	if a, _ := f.Account(ctx, "team-a", "day@2026-12-02T00:00:00Z"); a.Held.Tokens != 10 {
		t.Fatalf("an ended period that holds was forgotten: %+v", a)
	}
}
