package workflows

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// hello is the request most budget tests size: one short user message,
// whose prompt bound is helloPrompt tokens.
var hello = providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hello")}}

const helloPrompt = providers.RequestOverheadTokens + providers.MessageOverheadTokens + len("user") + len(`"hello"`)

func withParams(r providers.Request, kv ...string) providers.Request {
	r.Params = map[string]json.RawMessage{}
	for i := 0; i < len(kv); i += 2 {
		r.Params[kv[i]] = json.RawMessage(kv[i+1])
	}
	return r
}

func TestLedgerReservesSettlesAndNeverCommitsPastItsLimit(t *testing.T) {
	l := Ledger{Limit: Budget{Tokens: 1000, Cost: 1}}
	if !l.Reserve("a1", Spend{Tokens: 600, Cost: 0.5}) {
		t.Fatal("a first reservation within the limit was refused")
	}
	if ok, short := l.Fits(Spend{Tokens: 401}); ok || short != WhyTokenBudget {
		t.Fatalf("Fits(401 tokens) = %v, %q with 600 held of 1000", ok, short)
	}
	if ok, short := l.Fits(Spend{Tokens: 1, Cost: 0.6}); ok || short != WhyCostBudget {
		t.Fatalf("Fits(cost 0.6) = %v, %q with 0.5 held of 1", ok, short)
	}
	if l.Reserve("a2", Spend{Tokens: 401}) {
		t.Fatal("a reservation past the limit was held")
	}
	l.Settle("a1", Spend{Tokens: 150, Cost: 0.1})
	if len(l.Holds) != 0 || l.Settled != (Spend{Tokens: 150, Cost: 0.1}) {
		t.Fatalf("after settling: %+v", l)
	}
	if left := l.Left(); left.Tokens != 850 || math.Abs(left.Cost-0.9) > 1e-12 {
		t.Fatalf("left %+v", left)
	}
	l.Resettle(Spend{Tokens: 150, Cost: 0.1}, Spend{Tokens: 200, Cost: 0.2})
	if l.Settled != (Spend{Tokens: 200, Cost: 0.2}) {
		t.Fatalf("resettled %+v", l.Settled)
	}
	// A limit of one kind leaves the other unbounded.
	tokensOnly := Ledger{Limit: Budget{Tokens: 10}}
	if ok, _ := tokensOnly.Fits(Spend{Tokens: 10, Cost: 1e9}); !ok {
		t.Fatal("a token budget refused a cost")
	}
}

// The worst case of the next attempt and the output bound it is sent
// with (docs/contract.md section 4.3), one row per rule.
func TestGrantFor(t *testing.T) {
	openai := attempt.RouteInfo{Name: "a", Kind: "openai"}
	claude := attempt.RouteInfo{Name: "c", Kind: "anthropic"}
	priced := attempt.RouteInfo{Name: "p", Kind: "openai", Prices: &providers.Prices{Input: 1, CachedInput: 0.5, CacheWriteInput: 2, Output: 10}}
	free := attempt.RouteInfo{Name: "f", Kind: "openai", Prices: &providers.Prices{Input: 1, CachedInput: 1, CacheWriteInput: 1}}
	p := int64(helloPrompt)
	tokens := func(n int64) Ledger { return Ledger{Limit: Budget{Tokens: n}} }
	cost := func(c float64) Ledger { return Ledger{Limit: Budget{Cost: c}} }
	held := func(l Ledger, s Spend) Ledger { l.hold("x", s); return l }
	for _, tt := range []struct {
		name      string
		l         Ledger
		req       providers.Request
		route     attempt.RouteInfo
		ok        bool
		maxTokens int
		change    string
		worst     Spend
		why       string
	}{
		{"the request's max_tokens fits: sent as it is", tokens(10_000), withParams(hello, "max_tokens", "800"), openai, true, 800, "", Spend{Tokens: p + 800}, ""},
		{"no max_tokens: the budget adds its default", tokens(10_000), hello, openai, true, DefaultBudgetMaxTokens, MaxTokensAdded, Spend{Tokens: p + DefaultBudgetMaxTokens}, ""},
		{"no max_tokens on an anthropic route: the adapter's default", tokens(10_000), hello, claude, true, 1024, MaxTokensAdded, Spend{Tokens: p + 1024}, ""},
		{"too little left: lowered to what is left", tokens(p + 300), withParams(hello, "max_tokens", "800"), openai, true, 300, MaxTokensLowered, Spend{Tokens: p + 300}, ""},
		{"held reservations count", held(tokens(p+800), Spend{Tokens: 500}), withParams(hello, "max_tokens", "800"), openai, true, 300, MaxTokensLowered, Spend{Tokens: p + 300}, ""},
		{"never below the minimum: not sent", tokens(p + MinMaxTokens - 1), withParams(hello, "max_tokens", "800"), openai, false, MinMaxTokens, "", Spend{Tokens: p + MinMaxTokens}, WhyTokenBudget},
		{"not even the prompt fits: not sent", tokens(10), hello, openai, false, MinMaxTokens, MaxTokensAdded, Spend{Tokens: p + MinMaxTokens}, WhyTokenBudget},
		{"a request's own bound below the minimum is its floor", tokens(p + 5), withParams(hello, "max_tokens", "5"), openai, true, 5, "", Spend{Tokens: p + 5}, ""},
		{"n choices: each gets a share", tokens(p + 300), withParams(hello, "max_tokens", "800", "n", "3"), openai, true, 100, MaxTokensLowered, Spend{Tokens: p + 300}, ""},
		{"cost: prompt at the dearest input price, output at its own", cost(1), withParams(hello, "max_tokens", "800"), priced, true, 800, "",
			Spend{Tokens: p + 800, Cost: (float64(p)*2 + 800*10) / 1e6}, ""},
		{"cost: lowered to what the money left buys", cost((float64(p)*2 + 250*10) / 1e6), withParams(hello, "max_tokens", "800"), priced, true, 250, MaxTokensLowered,
			Spend{Tokens: p + 250, Cost: (float64(p)*2 + 250*10) / 1e6}, ""},
		{"cost: not even the minimum", cost(float64(p)*2/1e6 + 1e-9), withParams(hello, "max_tokens", "800"), priced, false, MinMaxTokens, "",
			Spend{Tokens: p + MinMaxTokens, Cost: (float64(p)*2 + MinMaxTokens*10) / 1e6}, WhyCostBudget},
		{"cost: a route without prices is never sent", cost(100), withParams(hello, "max_tokens", "800"), openai, false, MinMaxTokens, "", Spend{Tokens: p + MinMaxTokens}, WhyCostBudget},
		{"cost: free output, the prompt decides", cost(1), withParams(hello, "max_tokens", "800"), free, true, 800, "", Spend{Tokens: p + 800, Cost: float64(p) / 1e6}, ""},
		{"both: the tighter names the stop", Ledger{Limit: Budget{Tokens: 100_000, Cost: float64(p) * 2 / 1e6}}, withParams(hello, "max_tokens", "800"), priced, false, MinMaxTokens, "",
			Spend{Tokens: p + MinMaxTokens, Cost: (float64(p)*2 + MinMaxTokens*10) / 1e6}, WhyCostBudget},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g, ok, why := grantFor(tt.l, newSizing(tt.req), tt.route)
			if ok != tt.ok || why != tt.why || g.maxTokens != tt.maxTokens || g.change != tt.change || g.worst.Tokens != tt.worst.Tokens || math.Abs(g.worst.Cost-tt.worst.Cost) > 1e-12 {
				t.Fatalf("grantFor = %+v, %v, %q; want max_tokens %d (%q), worst %+v, %v, %q", g, ok, why, tt.maxTokens, tt.change, tt.worst, tt.ok, tt.why)
			}
			if ok {
				if fits, _ := tt.l.Fits(g.worst); !fits {
					t.Fatalf("granted a worst case %+v the ledger refuses", g.worst)
				}
			}
		})
	}
}

// A cost that does not divide evenly still never passes the limit.
func TestGrantForNeverPassesACostLimitByRounding(t *testing.T) {
	r := attempt.RouteInfo{Name: "p", Kind: "openai", Prices: &providers.Prices{Input: 0.15, CachedInput: 0.075, CacheWriteInput: 0.15, Output: 0.6}}
	for _, limit := range []float64{0.0001, 0.00123456789, 0.1, 1.0 / 3, 7e-5} {
		l := Ledger{Limit: Budget{Cost: limit}}
		l.Settle("earlier", Spend{Cost: limit / 3})
		g, ok, _ := grantFor(l, newSizing(withParams(hello, "max_tokens", "100000")), r)
		if !ok {
			continue
		}
		if l.Committed().Cost+g.worst.Cost > limit {
			t.Fatalf("limit %v: granted %+v over %v committed", limit, g, l.Committed())
		}
	}
}

func TestTheAnthropicDefaultIsTheAdapters(t *testing.T) {
	if providers.AnthropicMaxTokens != exchange.DefaultAnthropicMaxTokens {
		t.Fatalf("%d, the adapter's is %d", providers.AnthropicMaxTokens, exchange.DefaultAnthropicMaxTokens)
	}
}

// What an ended attempt counts against the budget, one row per rule of
// docs/contract.md section 4.3. Each attempt is classified by the real
// evidence.Classify.
func TestChargeOf(t *testing.T) {
	prices := &providers.Prices{Input: 1, CachedInput: 0.5, CacheWriteInput: 1, Output: 4}
	worst := Spend{Tokens: 1000, Cost: 0.004}
	usage := &providers.Usage{PromptTokens: 100, CachedTokens: 40, CompletionTokens: 20, TotalTokens: 120}
	used := Spend{Tokens: 120, Cost: (60*1 + 40*0.5 + 20*4) / 1e6}
	ev := func(f func(*evidence.Evidence)) evidence.Evidence {
		e := evidence.Evidence{ConnRef: "p-c1", RequestSent: true, StreamID: 3}
		f(&e)
		return e
	}
	for _, tt := range []struct {
		name  string
		ev    evidence.Evidence
		usage *providers.Usage
		want  Spend
	}{
		{"completed with usage: its usage", ev(func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true }), usage, used},
		{"completed without usage: its worst case", ev(func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true }), nil, worst},
		{"a partial that sent usage: what was delivered", ev(func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true; e.BodyFailed = true }), usage, used},
		{"a partial without usage: its worst case", ev(func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true; e.BodyFailed = true }), nil, worst},
		{"upstream_error (500) without usage: its worst case", ev(func(e *evidence.Evidence) { e.Status = 500 }), nil, worst},
		{"rejected without usage: its worst case", ev(func(e *evidence.Evidence) { e.Status = 400 }), nil, worst},
		{"throttled: never executed, nothing", ev(func(e *evidence.Evidence) { e.Status = 429 }), nil, Spend{}},
		{"refused: never executed, nothing", ev(func(e *evidence.Evidence) { e.GoAway = &evidence.GoAway{LastStreamID: 1} }), nil, Spend{}},
		{"unsent: nothing", ev(func(e *evidence.Evidence) { e.ConnRef, e.RequestSent, e.DialFailed = "", false, true }), nil, Spend{}},
		{"refused before sending: nothing", ev(func(e *evidence.Evidence) { e.RequestSent, e.Unsendable = false, evidence.UnsendableInvalid }), nil, Spend{}},
		{"canceled before sending: nothing", ev(func(e *evidence.Evidence) { e.RequestSent, e.Canceled, e.Stop = false, true, evidence.StopScope }), nil, Spend{}},
		{"canceled after sending: its worst case", ev(func(e *evidence.Evidence) { e.Canceled, e.Stop = true, evidence.StopScope }), nil, worst},
		{"ambiguous: its worst case", ev(func(e *evidence.Evidence) { e.ConnClosed = true }), nil, worst},
		{"a worker lost: its worst case, though the workflow saw nothing sent", evidence.Evidence{Activity: evidence.ActivityWorkerLost}, nil, worst},
		{"no worker took it: nothing", evidence.Evidence{Activity: evidence.ActivityQueueTimeout}, nil, Spend{}},
		{"a transport replay: another worst case per stream re-sent", ev(func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true; e.TransportReplays = 2 }), usage, used.Add(worst).Add(worst)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := evidence.Classify(tt.ev)
			got := chargeOf(c, tt.ev, tt.usage, prices, worst)
			if got.Tokens != tt.want.Tokens || math.Abs(got.Cost-tt.want.Cost) > 1e-15 {
				t.Fatalf("%s/%s: charged %+v, want %+v", c.Class, c.Reason, got, tt.want)
			}
		})
	}
}

// Section 5.2: what an ambiguous attempt counts once its verdict is in.
func TestChargeAfterVerdict(t *testing.T) {
	worst := Spend{Tokens: 1000}
	answer := &providers.Response{Text: "x", Usage: providers.Usage{PromptTokens: 30, CompletionTokens: 5}}
	for _, tt := range []struct {
		v      attempt.Verdict
		answer *providers.Response
		want   Spend
	}{
		{attempt.VerdictCompleted, answer, Spend{Tokens: 35}},
		{attempt.VerdictCompleted, &providers.Response{Text: "x"}, worst},
		{attempt.VerdictCompleted, nil, worst}, // a result_ref: its usage is not in history
		{attempt.VerdictNotExecuted, nil, Spend{}},
		{attempt.VerdictAllowReplay, nil, worst},
		{attempt.VerdictAbandon, nil, worst},
		{attempt.VerdictNone, nil, worst}, // a timeout, or the scope ended while waiting
	} {
		if got := chargeAfterVerdict(tt.v, tt.answer, nil, nil, worst); got != tt.want {
			t.Errorf("%q: charged %+v, want %+v", tt.v, got, tt.want)
		}
	}
}

// WorstCase, which the gateway reserves a caller's part with, is the
// worst case an action's budget reserves for the same attempt when
// nothing is lowered: one estimate, not two.
func TestWorstCaseIsWhatTheBudgetReserves(t *testing.T) {
	prices := &providers.Prices{Input: 3, CachedInput: 1, Output: 15}
	unlimited := Ledger{Limit: Budget{Tokens: MaxBudgetTokens, Cost: MaxBudgetCost}}
	for _, c := range []struct {
		name  string
		r     providers.Request
		route attempt.RouteInfo
	}{
		{"no max_tokens, openai", hello, attempt.RouteInfo{Name: "o", Kind: "openai", Prices: prices}},
		{"no max_tokens, anthropic", hello, attempt.RouteInfo{Name: "a", Kind: "anthropic", Prices: prices}},
		{"max_tokens and n", withParams(hello, "max_tokens", "300", "n", "3"), attempt.RouteInfo{Name: "o", Kind: "openai"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := unlimited
			if c.route.Prices == nil {
				l.Limit.Cost = 0 // no route without prices is sent under a cost limit
			}
			g, ok, _ := grantFor(l, newSizing(c.r), c.route)
			w, bounded := WorstCase(c.r, c.route)
			if !ok || !bounded || w != g.worst {
				t.Fatalf("WorstCase = %+v (%v), the budget reserves %+v (%v)", w, bounded, g.worst, ok)
			}
		})
	}
	file := providers.Request{Messages: []providers.Message{{Role: "user", Content: json.RawMessage(`[{"type":"file","file":{"file_id":"f"}}]`)}}}
	if _, ok := WorstCase(file, attempt.RouteInfo{}); ok {
		t.Fatal("a request with a file part has a worst case")
	}
}
