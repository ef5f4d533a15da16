package e2e_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// These run an action with a budget through the real workflow and the
// real CallModel activity, on the embedded Temporal server, against
// providertest: the provider's records are the ground truth of what was
// sent, and of the usage it reported.

// pricedRoutes is the stack's route with prices.
func (s *stack) pricedRoutes(p providers.Prices) func(*worker.Options) {
	return func(o *worker.Options) {
		o.Config = routes.Config{Routes: []routes.Route{
			{Name: "priced", Kind: "openai", BaseURL: s.p.URL() + "/v1", Model: "model-priced", Prices: &p,
				Capabilities: providers.Capabilities{Streaming: true}},
		}}
	}
}

func budgetInput(maxTokens int, b workflows.Budget) workflows.ActionInput {
	in := workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "say hello")},
			Params: map[string]json.RawMessage{"max_tokens": json.RawMessage(strconv.Itoa(maxTokens))}},
		Routes:  []string{"priced"},
		Budget:  &b,
		Backoff: workflows.Backoff{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond},
		// Two attempts on the one route before the budget says no.
		RetriesPerRoute: 3,
	}
	return in
}

// The case end to end: an action whose token budget fits two
// worst-case attempts, against a provider failing with 500, stops before
// a third with the budget outcome; the provider saw two requests.
func TestE2ETokenBudgetStopsBeforeTheThirdWorstCaseAttempt(t *testing.T) {
	s := newStack(t)
	s.startWorker(s.pricedRoutes(providers.Prices{Input: 1, CachedInput: 1, CacheWriteInput: 1, Output: 2}))
	s.p.SetDefault(providertest.ServerError(http.StatusInternalServerError))
	in := budgetInput(100, workflows.Budget{})
	prompt, _ := in.Request.PromptTokenBound(0)
	worst := int64(prompt + 100)
	in.Budget.Tokens = 2*worst + int64(prompt) + workflows.MinMaxTokens - 1

	res, err := s.run("budget-500", in)
	var ae *durallm.ActionError
	if !errors.As(err, &ae) || ae.State != workflows.StateSpendExhausted {
		t.Fatalf("err %v, want an ActionError in spend_exhausted", err)
	}
	if res.State != workflows.StateSpendExhausted || res.Reason != workflows.WhyTokenBudget || res.Outcome != string(evidence.UpstreamError) {
		t.Fatalf("state %s outcome %s reason %s; notes %v", res.State, res.Outcome, res.Reason, res.Notes)
	}
	if got := len(s.p.Received()); got != 2 || len(res.Attempts) != 2 {
		t.Fatalf("the provider received %d requests, the action made %d attempts; want 2: the third never left", got, len(res.Attempts))
	}
	for _, a := range res.Attempts {
		// A 500 reports no usage: nothing recorded, the worst case kept.
		if a.Classification.Class != evidence.UpstreamError || a.Usage != nil || a.Cost != 0 {
			t.Fatalf("attempt %d: %s usage %+v cost %v", a.N, a.Classification.Class, a.Usage, a.Cost)
		}
		if rv := a.Reservation; rv == nil || rv.Worst.Tokens != worst || rv.Charged == nil || rv.Charged.Tokens != worst {
			t.Fatalf("attempt %d reservation %+v, want %d reserved and charged", a.N, rv, worst)
		}
	}
	if l := res.Ledger; l.Committed().Tokens != 2*worst || l.Committed().Tokens > l.Limit.Tokens {
		t.Fatalf("ledger %+v", l)
	}
	s.saveHistory("budget-500", "spend_exhausted")
}

// Tokens and cost recorded per attempt are the provider's usage, cached
// tokens at their own price, in the attempt's record, the result's total
// and the worker's metrics, streamed or not; and the reservation is
// settled by that usage.
func TestE2EUsageAndCostRecordedAreTheProviders(t *testing.T) {
	s := newStack(t)
	tel, err := telemetry.New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	prices := providers.Prices{Input: 2.5, CachedInput: 1.25, CacheWriteInput: 2.5, Output: 10}
	w := s.startWorker(s.pricedRoutes(prices), func(o *worker.Options) { o.Telemetry, o.MetricsAddr = tel, "127.0.0.1:0" })
	sent := providertest.Usage{PromptTokens: 1200, CachedTokens: 1024, CompletionTokens: 7}
	want := providers.Usage{PromptTokens: 1200, CachedTokens: 1024, CompletionTokens: 7, TotalTokens: 1207}
	cost := (176*2.5 + 1024*1.25 + 7*10) / 1e6
	var total float64
	for _, stream := range []bool{false, true} {
		s.p.Push(providertest.Answer("hello there").WithUsage(sent))
		in := budgetInput(200, workflows.Budget{Tokens: 100_000, Cost: 1})
		in.Request.Stream, in.Needs.Streaming, in.Caller = stream, stream, "team-a"
		res, err := s.run("usage-"+map[bool]string{false: "json", true: "stream"}[stream], in)
		if err != nil || res.State != workflows.StateCompleted || len(res.Attempts) != 1 {
			t.Fatalf("stream %v: state %s err %v", stream, res.State, err)
		}
		a := res.Attempts[0]
		if a.Usage == nil || *a.Usage != want || math.Abs(a.Cost-cost) > 1e-12 {
			t.Fatalf("stream %v: recorded usage %+v cost %v; the provider reported %+v, which costs %v", stream, a.Usage, a.Cost, want, cost)
		}
		if res.Usage != want || math.Abs(res.Cost-cost) > 1e-12 {
			t.Fatalf("stream %v: the result's totals %+v %v", stream, res.Usage, res.Cost)
		}
		if c := a.Reservation.Charged; c == nil || c.Tokens != 1207 || math.Abs(c.Cost-cost) > 1e-12 || len(res.Ledger.Holds) != 0 {
			t.Fatalf("stream %v: charged %+v, ledger %+v", stream, c, res.Ledger)
		}
		total += cost
	}
	body, err := providertest.Scrape("http://" + w.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	who := []string{`durallm_route="priced"`, `durallm_caller="team-a"`}
	for typ, n := range map[string]float64{"input": 2 * 176, "cached_input": 2 * 1024, "output": 2 * 7} {
		if got := providertest.MetricSum(body, "durallm_tokens_total", append(who, `durallm_token_type="`+typ+`"`)...); got != n {
			t.Errorf("durallm_tokens_total{%s} = %v, want %v", typ, got, n)
		}
	}
	if got := providertest.MetricSum(body, "durallm_cost_total", who...); math.Abs(got-total) > 1e-12 {
		t.Errorf("durallm_cost_total = %v, want %v", got, total)
	}
}
