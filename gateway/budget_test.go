package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// What an ended action is charged against its caller's budget, by what
// reading its result gave.
func TestChargeOfAnEndedAction(t *testing.T) {
	held := workflows.Spend{Tokens: 5000, Cost: 2}
	ledger := &workflows.Ledger{Limit: workflows.Budget{Tokens: 5000}, Settled: workflows.Spend{Tokens: 1200}, Holds: []workflows.Hold{{ID: "a-2", Spend: workflows.Spend{Tokens: 300}}}}
	ended := func(st workflows.State) workflows.ActionResult {
		return workflows.ActionResult{Status: workflows.Status{State: st, Ledger: ledger}}
	}
	for _, c := range []struct {
		name   string
		res    workflows.ActionResult
		err    error
		want   workflows.Spend
		isOver bool
	}{
		{"completed: what its ledger committed, settled and held", ended(workflows.StateCompleted), nil, workflows.Spend{Tokens: 1500}, true},
		{"failed: the same, from the action error's result", ended(workflows.StateFailed), &durallm.ActionError{State: workflows.StateFailed}, workflows.Spend{Tokens: 1500}, true},
		{"invalid input: nothing was sent", workflows.ActionResult{}, &workflows.InputError{Problems: []error{errors.New("x")}}, workflows.Spend{}, true},
		{"not found: nothing says, the whole hold", workflows.ActionResult{}, fmt.Errorf("x: %w", durallm.ErrNotFound), held, true},
		{"Temporal unreachable: not yet", workflows.ActionResult{}, errors.New("unavailable"), workflows.Spend{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, over := chargeOf(c.res, c.err, held)
			if over != c.isOver || got != c.want {
				t.Fatalf("chargeOf = %+v, %v; want %+v, %v", got, over, c.want, c.isOver)
			}
		})
	}
}

// The worst case a caller's budget reserves is the dearest route's, and
// under a cost limit only priced routes count.
func TestTheWorstCaseOfACallersRequest(t *testing.T) {
	cheap := &providers.Prices{Input: 1, Output: 2}
	dear := &providers.Prices{Input: 3, Output: 15}
	s := &spending{routes: map[string]attempt.RouteInfo{
		"cheap": {Name: "cheap", Kind: "openai", Prices: cheap},
		"dear":  {Name: "dear", Kind: "anthropic", Prices: dear},
		"free":  {Name: "free", Kind: "openai"},
	}}
	r := providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}}
	m := Model{Name: "m", Routes: []string{"cheap", "dear", "free"}}
	got, p := s.worstCase(r, m, false)
	if p != nil {
		t.Fatal(p)
	}
	free, _ := workflows.WorstCase(r, s.routes["free"])
	dearest, _ := workflows.WorstCase(r, s.routes["dear"])
	if got.Tokens != free.Tokens || got.Cost != dearest.Cost {
		t.Fatalf("worst %+v: want the most tokens (%d, the openai default bound) and the dearest cost (%v)", got, free.Tokens, dearest.Cost)
	}
	if _, p := s.worstCase(r, Model{Name: "f", Routes: []string{"free"}}, true); p == nil || p.Kind != answer.InvalidRequest || p.Param != "model" {
		t.Fatalf("a cost limit on a model without prices: %+v", p)
	}
	file := providers.Request{Messages: []providers.Message{{Role: "user", Content: json.RawMessage(`[{"type":"file","file":{"file_id":"f"}}]`)}}}
	if _, p := s.worstCase(file, m, false); p == nil || p.Kind != answer.InvalidRequest {
		t.Fatalf("a file part: %+v", p)
	}
}
