package workflows

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
)

// These run LLMAction with a budget in virtual time, CallModel scripted
// per attempt as in action_test.go.

// priced is a route with prices, for the cost budget and usage tests.
var pricedRoute = routes.Route{Name: "priced", Kind: "openai", Model: "model-p", Prices: &providers.Prices{Input: 2, CachedInput: 1, CacheWriteInput: 2, Output: 8}}

func withPriced(a *activities.Activities) {
	a.Routes = map[string]routes.Route{"a": testRoutes["a"], "b": testRoutes["b"], "priced": pricedRoute}
}

// answering completes with text and the usage u, as the provider reported it.
func answering(u providers.Usage) step {
	return step{f: func(_ context.Context, in attempt.Input) (attempt.Outcome, error) {
		o := done(in)
		o.Response.Usage = u
		o.Usage = &u
		return o, nil
	}}
}

// sentMaxTokens is the output bound an attempt's request carried.
func sentMaxTokens(t *testing.T, in attempt.Input) int {
	t.Helper()
	n, ok := in.Request.MaxOutputTokens()
	if !ok {
		t.Fatalf("attempt %d was sent without max_tokens: %s", in.Attempt, in.Request.Params)
	}
	return n
}

// The case in virtual time: a token budget that fits two
// worst-case attempts, a provider failing with 500 (no usage, so each
// keeps its worst case), and the third attempt is never sent.
func TestATokenBudgetStopsBeforeTheThirdWorstCaseAttempt(t *testing.T) {
	worst := int64(helloPrompt + 100)
	r := newRun(t, upstream500, upstream500, ok)
	in := input("a")
	in.Request = withParams(in.Request, "max_tokens", "100")
	in.Budget = &Budget{Tokens: 2*worst + int64(helloPrompt) + MinMaxTokens - 1}
	res := r.exec(in)

	if res.State != StateSpendExhausted || res.Reason != WhyTokenBudget || res.Outcome != string(evidence.UpstreamError) {
		t.Fatalf("state %s outcome %s reason %s, want spend_exhausted upstream_error token_budget_exhausted; notes %v", res.State, res.Outcome, res.Reason, res.Notes)
	}
	if r.attemptsStarted() != 2 || res.Used != 2 {
		t.Fatalf("%d attempts started, %d used; want 2: the third does not fit", r.attemptsStarted(), res.Used)
	}
	for i, a := range res.Attempts {
		rv := a.Reservation
		if rv == nil || rv.Worst.Tokens != worst || rv.MaxTokens != 100 || rv.MaxTokensChange != "" || rv.Charged == nil || rv.Charged.Tokens != worst {
			t.Fatalf("attempt %d reservation %+v: want %d reserved and charged (a 500 reports no usage)", i+1, rv, worst)
		}
		if a.Usage != nil || a.Cost != 0 {
			t.Fatalf("attempt %d usage %+v cost %v: the provider reported none", i+1, a.Usage, a.Cost)
		}
		if n := sentMaxTokens(t, r.calls[i]); n != 100 {
			t.Fatalf("attempt %d sent max_tokens %d", i+1, n)
		}
	}
	last := res.Attempts[1].Decision
	if last.Next != DecideStop || last.Why != WhyTokenBudget {
		t.Fatalf("the last attempt's decision %+v", last)
	}
	if l := res.Ledger; l == nil || l.Settled.Tokens != 2*worst || len(l.Holds) != 0 || l.Settled.Tokens > l.Limit.Tokens {
		t.Fatalf("ledger %+v", l)
	}
	if !hasNote(res, "was not sent: its worst case") {
		t.Fatalf("no note says why: %v", res.Notes)
	}
}

// When what is left is less than the request's max_tokens, the attempt
// goes with a lowered one, and its record, its request and its summary
// say so.
func TestTheBudgetLowersMaxTokensToWhatIsLeftVisibly(t *testing.T) {
	r := newRun(t, upstream500, ok)
	in := input("a")
	in.Request = withParams(in.Request, "max_tokens", "800")
	in.Budget = &Budget{Tokens: int64(helloPrompt+800) + int64(helloPrompt) + 50}
	res := r.exec(in)
	if res.State != StateCompleted || r.attemptsStarted() != 2 {
		t.Fatalf("state %s after %d attempts; notes %v", res.State, r.attemptsStarted(), res.Notes)
	}
	second := res.Attempts[1]
	if rv := second.Reservation; rv == nil || rv.MaxTokens != 50 || rv.MaxTokensChange != MaxTokensLowered {
		t.Fatalf("second reservation %+v, want max_tokens lowered to 50", rv)
	}
	if n := sentMaxTokens(t, r.calls[1]); n != 50 {
		t.Fatalf("the second attempt was sent with max_tokens %d, want 50", n)
	}
	if !strings.Contains(second.Summary, "max_tokens 50 (lowered by the budget)") {
		t.Fatalf("summary %q", second.Summary)
	}
	if n := sentMaxTokens(t, r.calls[0]); n != 800 {
		t.Fatalf("the first attempt was sent with max_tokens %d, want the request's 800", n)
	}
}

// Usage settles a reservation: an attempt charged its usage leaves the
// rest of its worst case to the next; the records carry usage and cost,
// and the result the totals.
func TestUsageSettlesTheReservationAndIsRecordedWithItsCost(t *testing.T) {
	u := providers.Usage{PromptTokens: 50, CachedTokens: 20, CompletionTokens: 10, TotalTokens: 60}
	partialWithUsage := step{f: func(_ context.Context, in attempt.Input) (attempt.Outcome, error) {
		o := classified(in, func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true; e.BodyFailed = true })
		o.Response = &providers.Response{Text: "half", Partial: true, Incomplete: "reset", Usage: u}
		o.Usage = &u
		return o, nil
	}}
	for _, tt := range []struct {
		name  string
		steps []step
		state State
	}{
		{"completed", []step{answering(u)}, StateCompleted},
		{"a streamed partial counts what was delivered", []step{partialWithUsage}, StateCompletedPartial},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRunWith(t, withPriced, tt.steps...)
			in := input("priced")
			in.Budget = &Budget{Tokens: 100_000, Cost: 1}
			res := r.exec(in)
			if res.State != tt.state {
				t.Fatalf("state %s; notes %v", res.State, res.Notes)
			}
			cost := (30*2 + 20*1 + 10*8) / 1e6
			a := res.Attempts[0]
			if a.Usage == nil || *a.Usage != u || math.Abs(a.Cost-cost) > 1e-15 {
				t.Fatalf("record usage %+v cost %v, want %+v %v", a.Usage, a.Cost, u, cost)
			}
			if c := a.Reservation.Charged; c == nil || c.Tokens != 60 || math.Abs(c.Cost-cost) > 1e-15 {
				t.Fatalf("charged %+v", c)
			}
			if res.Usage != u || math.Abs(res.Cost-cost) > 1e-15 || res.Ledger.Settled.Tokens != 60 || len(res.Ledger.Holds) != 0 {
				t.Fatalf("totals %+v cost %v ledger %+v", res.Usage, res.Cost, res.Ledger)
			}
		})
	}
}

// Without a budget nothing is reserved or changed, and usage and cost
// are still recorded.
func TestWithoutABudgetUsageIsRecordedAndNothingIsChanged(t *testing.T) {
	u := providers.Usage{PromptTokens: 1000, CompletionTokens: 500, TotalTokens: 1500}
	r := newRunWith(t, withPriced, upstream500, answering(u))
	res := r.exec(input("priced"))
	if res.State != StateCompleted || res.Ledger != nil || res.Attempts[0].Reservation != nil || res.Attempts[1].Reservation != nil {
		t.Fatalf("state %s ledger %+v", res.State, res.Ledger)
	}
	if _, set := r.calls[1].Request.MaxOutputTokens(); set || len(r.calls[1].Request.Params) != 0 {
		t.Fatalf("params changed without a budget: %s", r.calls[1].Request.Params)
	}
	if res.Usage != u || math.Abs(res.Cost-(1000*2+500*8)/1e6) > 1e-15 || res.Attempts[1].Cost != res.Cost {
		t.Fatalf("usage %+v cost %v", res.Usage, res.Cost)
	}
}

// The contract's rule for an ambiguous attempt: its reservation holds
// until its verdict. While it waits the ledger holds its worst case and
// no charge is recorded; not_executed releases it (the next attempt then
// fits), and allow_replay keeps it charged (the next one does not).
func TestAnAmbiguousAttemptHoldsItsReservationUntilItsVerdict(t *testing.T) {
	worst := int64(helloPrompt + 100)
	for _, tt := range []struct {
		verdict attempt.Verdict
		state   State
		charged int64
	}{
		{attempt.VerdictNotExecuted, StateCompleted, 0},
		{attempt.VerdictAllowReplay, StateSpendExhausted, worst},
		{attempt.VerdictAbandon, StateIndeterminate, worst},
	} {
		t.Run(string(tt.verdict), func(t *testing.T) {
			r := newRun(t, connLost, answering(providers.Usage{PromptTokens: 20, CompletionTokens: 5}))
			in := input("a")
			in.Request = withParams(in.Request, "max_tokens", "100")
			// One worst case fits, not two.
			in.Budget = &Budget{Tokens: worst + int64(helloPrompt) + MinMaxTokens - 1}
			var during Status
			r.afterAwaiting(time.Minute, func() {
				during = r.status()
				r.env.SignalWorkflow(SignalReconcile, ReconcileRequest{Attempt: 1, Verdict: tt.verdict})
			})
			res := r.exec(in)

			if during.State != StateAwaitingReconciliation {
				t.Fatalf("while waiting: %s", during.State)
			}
			if l := during.Ledger; l == nil || len(l.Holds) != 1 || l.Holds[0].Spend.Tokens != worst || l.Settled.Tokens != 0 {
				t.Fatalf("while waiting the ledger is %+v, want the attempt's worst case %d held", l, worst)
			}
			if rv := during.Attempts[0].Reservation; rv == nil || rv.Charged != nil {
				t.Fatalf("while waiting the attempt's reservation is %+v, want held (no charge)", rv)
			}
			if res.State != tt.state {
				t.Fatalf("state %s (%s); notes %v", res.State, res.Reason, res.Notes)
			}
			if c := res.Attempts[0].Reservation.Charged; c == nil || c.Tokens != tt.charged {
				t.Fatalf("after %s the ambiguous attempt is charged %+v, want %d", tt.verdict, c, tt.charged)
			}
			if len(res.Ledger.Holds) != 0 || res.Ledger.Committed().Tokens > res.Ledger.Limit.Tokens {
				t.Fatalf("ledger %+v", res.Ledger)
			}
			if tt.state == StateCompleted && (r.attemptsStarted() != 2 || res.Ledger.Settled.Tokens != 25) {
				t.Fatalf("attempts %d, settled %+v", r.attemptsStarted(), res.Ledger.Settled)
			}
		})
	}
}

// An ambiguous attempt replayed under the replay policy gets no verdict:
// it keeps its worst case, and the replay is sized with it held.
func TestAReplayIsSizedWithTheAmbiguousAttemptStillCharged(t *testing.T) {
	worst := int64(helloPrompt + 100)
	r := newRun(t, connLost, ok)
	in := input("idem")
	in.ReplayPolicy = ReplayIdempotent
	in.Request = withParams(in.Request, "max_tokens", "100")
	in.Budget = &Budget{Tokens: worst + int64(helloPrompt) + 40}
	res := r.exec(in)
	if res.State != StateCompleted || r.attemptsStarted() != 2 {
		t.Fatalf("state %s attempts %d; notes %v", res.State, r.attemptsStarted(), res.Notes)
	}
	if c := res.Attempts[0].Reservation.Charged; c == nil || c.Tokens != worst {
		t.Fatalf("the replayed attempt is charged %+v, want its worst case", c)
	}
	if rv := res.Attempts[1].Reservation; rv.MaxTokens != 40 || rv.MaxTokensChange != MaxTokensLowered {
		t.Fatalf("the replay's reservation %+v, want max_tokens lowered to 40", rv)
	}
}

// A cost budget skips the routes without prices, and an action whose
// first attempt does not fit ends without sending anything.
func TestACostBudgetNeedsPricesAndNothingIsSentThatCannotFit(t *testing.T) {
	r := newRunWith(t, withPriced, ok)
	in := input("a", "priced")
	in.Budget = &Budget{Cost: 1e-6}
	res := r.exec(in)
	if res.State != StateSpendExhausted || res.Reason != WhyCostBudget || r.attemptsStarted() != 0 || len(res.Attempts) != 0 {
		t.Fatalf("state %s reason %s, %d attempts; notes %v", res.State, res.Reason, r.attemptsStarted(), res.Notes)
	}
	if !hasNote(res, "route a skipped: it has no prices") || !hasNote(res, "the next attempt on priced was not sent") {
		t.Fatalf("notes %v", res.Notes)
	}
}

// The attempt's one event carries its usage, cost and reservation, as its
// record does.
func TestTheAttemptEventCarriesUsageCostAndReservation(t *testing.T) {
	u := providers.Usage{PromptTokens: 40, CompletionTokens: 10, TotalTokens: 50}
	r := newRunWith(t, withPriced, answering(u))
	in := input("priced")
	in.Budget = &Budget{Tokens: 10_000}
	in.Caller = "team-a"
	res := r.exec(in)
	if r.calls[0].Caller != "team-a" {
		t.Fatalf("the attempt's caller %q", r.calls[0].Caller)
	}
	var ev map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.events.String())), &ev); err != nil {
		t.Fatalf("event %q: %v", r.events.String(), err)
	}
	rv := res.Attempts[0].Reservation
	for k, want := range map[string]any{
		"gen_ai.usage.input_tokens": 40.0, "gen_ai.usage.output_tokens": 10.0, "cost": res.Attempts[0].Cost,
		"reserved_tokens": float64(rv.Worst.Tokens), "max_tokens": float64(DefaultBudgetMaxTokens), "max_tokens_change": MaxTokensAdded,
		"charged_tokens": 50.0,
	} {
		if ev[k] != want {
			t.Errorf("event %s = %v, want %v", k, ev[k], want)
		}
	}
}

func TestInvalidBudgetsAndCallersAreRefusedNamingTheField(t *testing.T) {
	file := providers.Message{Role: "user", Content: json.RawMessage(`[{"type":"file","file":{"file_id":"file-1"}}]`)}
	for _, tt := range []struct {
		name  string
		edit  func(*ActionInput)
		field string
	}{
		{"negative tokens", func(in *ActionInput) { in.Budget = &Budget{Tokens: -1} }, "budget.tokens: negative"},
		{"absurd tokens", func(in *ActionInput) { in.Budget = &Budget{Tokens: MaxBudgetTokens + 1} }, "budget.tokens: above"},
		{"negative cost", func(in *ActionInput) { in.Budget = &Budget{Cost: -0.01} }, "budget.cost: negative"},
		{"not a number", func(in *ActionInput) { in.Budget = &Budget{Cost: math.NaN()} }, "budget.cost: not a finite number"},
		{"absurd cost", func(in *ActionInput) { in.Budget = &Budget{Cost: MaxBudgetCost * 10} }, "budget.cost: above"},
		{"a limit of zero", func(in *ActionInput) { in.Budget = &Budget{} }, "budget: neither tokens nor cost"},
		{"an unbounded prompt", func(in *ActionInput) {
			in.Budget = &Budget{Tokens: 1000}
			in.Request.Messages = append(in.Request.Messages, file)
		}, "budget: the request has a file content part"},
		{"a caller with a newline", func(in *ActionInput) { in.Caller = "team\na" }, "caller: not UTF-8 text"},
		{"a long caller", func(in *ActionInput) { in.Caller = strings.Repeat("c", 129) }, "caller: 129 bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := input("a").WithDefaults("wf")
			tt.edit(&in)
			err := in.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate = %v, want it to name %q", err, tt.field)
			}
		})
	}
	in := input("a").WithDefaults("wf")
	in.Budget, in.Caller = &Budget{Cost: 0.5}, "team-a@example"
	if err := in.Validate(); err != nil {
		t.Fatal(err)
	}
}
