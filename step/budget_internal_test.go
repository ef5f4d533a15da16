package step

import (
	"testing"

	"github.com/durallm/durallm/workflows"
)

// The rule of what one call reserves, row by row.
func TestReservationRule(t *testing.T) {
	tokens := func(limit, settled int64, held ...int64) workflows.Ledger {
		l := workflows.Ledger{Limit: workflows.Budget{Tokens: limit}, Settled: workflows.Spend{Tokens: settled}}
		for _, h := range held {
			l.Holds = append(l.Holds, workflows.Hold{ID: "h", Spend: workflows.Spend{Tokens: h}})
		}
		return l
	}
	both := workflows.Ledger{Limit: workflows.Budget{Tokens: 1000, Cost: 1}, Settled: workflows.Spend{Tokens: 400, Cost: 0.25}}
	for _, c := range []struct {
		name    string
		l       workflows.Ledger
		perCall workflows.Budget
		own     *workflows.Budget
		want    workflows.Budget
		why     string
	}{
		{name: "all that is left", l: tokens(1000, 300), want: workflows.Budget{Tokens: 700}},
		{name: "what calls hold is not left", l: tokens(1000, 300, 200, 100), want: workflows.Budget{Tokens: 400}},
		{name: "capped per call", l: tokens(1000, 300), perCall: workflows.Budget{Tokens: 250}, want: workflows.Budget{Tokens: 250}},
		{name: "a cap above what is left leaves what is left", l: tokens(1000, 900), perCall: workflows.Budget{Tokens: 250}, want: workflows.Budget{Tokens: 100}},
		{name: "capped by the call's own budget", l: tokens(1000, 300), perCall: workflows.Budget{Tokens: 250}, own: &workflows.Budget{Tokens: 50}, want: workflows.Budget{Tokens: 50}},
		{name: "the call's own limit of a kind the parent does not bound is kept", l: tokens(1000, 0), own: &workflows.Budget{Cost: 0.5}, want: workflows.Budget{Tokens: 1000, Cost: 0.5}},
		{name: "nothing left: not started", l: tokens(1000, 600, 400), why: workflows.WhyTokenBudget},
		{name: "over committed: not started", l: tokens(1000, 1200), why: workflows.WhyTokenBudget},
		{name: "both kinds", l: both, perCall: workflows.Budget{Cost: 0.5}, want: workflows.Budget{Tokens: 600, Cost: 0.5}},
		{name: "no cost left", l: workflows.Ledger{Limit: workflows.Budget{Tokens: 1000, Cost: 1}, Settled: workflows.Spend{Tokens: 10, Cost: 1}}, why: workflows.WhyCostBudget},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok, why := reservation(c.l, c.perCall, c.own)
			if c.why != "" {
				if ok || why != c.why {
					t.Fatalf("reserved %+v (ok %v, %q), want refused with %q", got, ok, why, c.why)
				}
				return
			}
			if !ok || got != c.want {
				t.Fatalf("reserved %+v (ok %v, %q), want %+v", got, ok, why, c.want)
			}
		})
	}
}

// A call is counted once, by its name or its action id, and settled once.
func TestACallIsCountedAndSettledOnce(t *testing.T) {
	b := Budget{Limit: workflows.Budget{Tokens: 100}, Calls: []BudgetCall{
		{Name: "plan", ActionID: "p-plan", Reserved: workflows.Spend{Tokens: 40}},
		{ActionID: "p-learned", Reserved: workflows.Spend{Tokens: 30}},
	}}
	if b.find("plan", "x") != 0 || b.find("other", "p-learned") != 1 || b.find("", "p-none") != -1 || b.find("other", "") != -1 {
		t.Fatal("find")
	}
	b.settle(0, workflows.Spend{Tokens: 25})
	b.settle(0, workflows.Spend{Tokens: 40})
	if l := b.Ledger(); l.Settled.Tokens != 25 || len(l.Holds) != 1 || l.Holds[0].ID != "p-learned" || b.Left().Tokens != 45 || b.Holding() != 1 {
		t.Fatalf("ledger %+v left %+v", l, b.Left())
	}
}
