package workflows

import (
	"fmt"
	"math"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

// This file is an action's spending budget (docs/contract.md section
// 4.3): before each attempt the workflow reserves the attempt's worst
// case, and an attempt whose worst case does not fit is not sent; the
// provider's usage settles the reservation when the attempt ends. Every
// function here is pure and deterministic: the workflow applies them.

// Budget bounds what an action's attempts may spend, across every
// retry, fallback and replay, in tokens and/or cost. A zero field sets
// no limit of its kind; a Budget with neither is invalid (leave it out
// for none).
type Budget struct {
	// Tokens bounds prompt plus completion tokens (cached prompt tokens
	// included, as providers count them). Zero: no token limit.
	Tokens int64 `json:"tokens,omitempty"`
	// Cost bounds the cost of those tokens at the routes' prices (per
	// million tokens, in the currency the routes file writes them in).
	// A route without prices cannot serve an action with a cost budget
	// and is skipped. Zero: no cost limit.
	Cost float64 `json:"cost,omitempty"`
}

// The bounds Validate puts on a Budget: a larger one is a typo, not a
// budget.
const (
	MaxBudgetTokens = 1_000_000_000_000
	MaxBudgetCost   = 1_000_000_000
)

// Spend is an amount of tokens and cost.
type Spend struct {
	Tokens int64   `json:"tokens"`
	Cost   float64 `json:"cost"`
}

// Add returns s plus o.
func (s Spend) Add(o Spend) Spend { return Spend{Tokens: s.Tokens + o.Tokens, Cost: s.Cost + o.Cost} }

// Sub returns s minus o.
func (s Spend) Sub(o Spend) Spend { return Spend{Tokens: s.Tokens - o.Tokens, Cost: s.Cost - o.Cost} }

// Ledger keeps a budget's accounts: what ended attempts were charged
// (Settled) and what reservations still hold (Holds), so that what is
// committed never passes the limit. It is a plain value, deterministic
// and JSON-encodable, so any workflow may keep one in its state and
// carry it across Continue-As-New. The zero Ledger has no limit.
type Ledger struct {
	Limit   Budget `json:"limit"`
	Settled Spend  `json:"settled"`
	Holds   []Hold `json:"holds,omitempty"`
}

// Hold is one reservation not yet settled.
type Hold struct {
	ID    string `json:"id"`
	Spend Spend  `json:"spend"`
}

// Held is the sum of the holds.
func (l Ledger) Held() Spend {
	var s Spend
	for _, h := range l.Holds {
		s = s.Add(h.Spend)
	}
	return s
}

// Committed is what is settled plus what is held.
func (l Ledger) Committed() Spend { return l.Settled.Add(l.Held()) }

// Left is what the limit leaves after what is committed, never below
// zero; a kind without a limit is left at zero.
func (l Ledger) Left() Spend {
	c := l.Committed()
	var left Spend
	if l.Limit.Tokens > 0 {
		left.Tokens = max(0, l.Limit.Tokens-c.Tokens)
	}
	if l.Limit.Cost > 0 {
		left.Cost = max(0, l.Limit.Cost-c.Cost)
	}
	return left
}

// Fits reports whether s can be reserved now: what is committed plus s
// stays within every limit set. When it does not, short names the limit
// it passes: WhyTokenBudget or WhyCostBudget.
func (l Ledger) Fits(s Spend) (ok bool, short string) {
	c := l.Committed().Add(s)
	switch {
	case l.Limit.Tokens > 0 && c.Tokens > l.Limit.Tokens:
		return false, WhyTokenBudget
	case l.Limit.Cost > 0 && c.Cost > l.Limit.Cost:
		return false, WhyCostBudget
	}
	return true, ""
}

// Reserve holds s under id when it fits, and reports whether it did.
func (l *Ledger) Reserve(id string, s Spend) bool {
	if ok, _ := l.Fits(s); !ok {
		return false
	}
	l.hold(id, s)
	return true
}

// hold holds s under id, fitting or not.
func (l *Ledger) hold(id string, s Spend) { l.Holds = append(l.Holds, Hold{ID: id, Spend: s}) }

// Settle releases the hold id (if any) and charges s instead.
func (l *Ledger) Settle(id string, s Spend) {
	for i, h := range l.Holds {
		if h.ID == id {
			l.Holds = append(l.Holds[:i:i], l.Holds[i+1:]...)
			break
		}
	}
	l.Settled = l.Settled.Add(s)
}

// Resettle corrects a charge already settled, from was to now (a lost
// partial whose whole response, with its usage, the journal held).
func (l *Ledger) Resettle(was, now Spend) { l.Settled = l.Settled.Sub(was).Add(now) }

// The decision's why, and the terminal reason, when the next attempt's
// worst case does not fit the budget.
const (
	WhyTokenBudget = "token_budget_exhausted"
	WhyCostBudget  = "cost_budget_exhausted"
)

// The output bound an attempt under a budget is sent with, per choice.
const (
	// MinMaxTokens is the least max_tokens the budget lowers a request's
	// to (or the request's own, when smaller): a shorter answer is no
	// answer, so an attempt that cannot have it is not sent. OpenAI's
	// Responses API has the same floor for max_output_tokens.
	MinMaxTokens = 16
	// DefaultBudgetMaxTokens is the max_tokens an attempt under a budget
	// is sent with when its request sets none (on an anthropic route,
	// the adapter's own default instead, providers.AnthropicMaxTokens):
	// an unbounded answer has no worst case to reserve.
	DefaultBudgetMaxTokens = providers.DefaultOutputTokens
)

// How the budget changed an attempt's max_tokens
// (Reservation.MaxTokensChange).
const (
	// MaxTokensLowered: the request's own was lowered to what was left.
	MaxTokensLowered = "lowered"
	// MaxTokensAdded: the request set none; the budget set it.
	MaxTokensAdded = "added"
)

// Reservation is what an action's budget reserved for one attempt before
// sending it, and what the attempt was charged once it ended.
type Reservation struct {
	// Worst is the attempt's worst case: its prompt's upper bound plus
	// MaxTokens per choice, priced at the dearest input price.
	Worst Spend `json:"worst"`
	// MaxTokens is the output bound per choice the attempt was sent with.
	MaxTokens int `json:"max_tokens"`
	// MaxTokensChange is MaxTokensLowered or MaxTokensAdded when the
	// budget changed the request's max_tokens; empty when it did not.
	MaxTokensChange string `json:"max_tokens_change,omitempty"`
	// Charged is what the attempt counts against the budget, once
	// settled: its usage, nothing, or its worst case (chargeOf). Nil
	// while the reservation holds: an ambiguous attempt awaiting its
	// verdict.
	Charged *Spend `json:"charged,omitempty"`
}

// sizing is the action's part of every attempt's worst case.
type sizing struct {
	request   providers.Request
	maxTokens int  // the request's own bound per choice
	bounded   bool // the request sets one
	choices   int
}

func newSizing(r providers.Request) sizing {
	n, set := r.MaxOutputTokens()
	return sizing{request: r, maxTokens: n, bounded: set, choices: r.Choices()}
}

// worstCase is the arithmetic of an attempt's worst case on route r:
// the output bound per choice it asks for (the request's, else the one a
// budget adds, with change MaxTokensAdded), its prompt's upper bound, its
// choices, and its worst case at any output bound out.
func (s sizing) worstCase(r attempt.RouteInfo) (want int, change string, prompt, n int64, worst func(out int64) Spend) {
	p, _ := s.request.PromptTokenBound(r.ImageTokens)
	prompt = int64(p)
	want = s.maxTokens
	if !s.bounded {
		want, change = DefaultBudgetMaxTokens, MaxTokensAdded
		if r.Kind == "anthropic" { // routes.KindAnthropic, which the workflow does not link
			want = providers.AnthropicMaxTokens
		}
	}
	n = int64(max(1, s.choices))
	worst = func(out int64) Spend {
		w := Spend{Tokens: prompt + out*n}
		if r.Prices != nil {
			w.Cost = r.Prices.WorstCost(prompt, out*n)
		}
		return w
	}
	return want, change, prompt, n, worst
}

// WorstCase is what one attempt of request r on route can spend at
// most when its output bound is not lowered: what an action's budget
// reserves before sending it (docs/contract.md section 4.3), the
// request's max_tokens (or the bound a budget adds) per choice plus its
// prompt's upper bound, priced at the route's dearest input price. ok is
// false when nothing bounds the prompt (a file content part): such a
// request can have no budget. The gateway reserves a caller's part with
// it before it starts an action.
func WorstCase(r providers.Request, route attempt.RouteInfo) (w Spend, ok bool) {
	if _, ok := r.PromptTokenBound(route.ImageTokens); !ok {
		return Spend{}, false
	}
	want, _, _, _, worst := newSizing(r).worstCase(route)
	return worst(int64(want)), true
}

// grant is what the budget lets the next attempt have.
type grant struct {
	maxTokens int
	change    string
	worst     Spend
}

// grantFor sizes the next attempt on route r against l: the request's
// max_tokens (DefaultBudgetMaxTokens, or the anthropic adapter's default,
// when it sets none), lowered to what l leaves after the prompt's upper
// bound, never below MinMaxTokens (or the request's own when smaller).
// ok is false when that does not fit; why then names the limit, and g's
// worst is the least the attempt needed.
func grantFor(l Ledger, s sizing, r attempt.RouteInfo) (g grant, ok bool, why string) {
	want, change, prompt, n, worst := s.worstCase(r)
	committed := l.Committed()
	out := int64(want)
	if l.Limit.Tokens > 0 {
		if fit := floorDiv(l.Limit.Tokens-committed.Tokens-prompt, n); fit < out {
			out, why = fit, WhyTokenBudget
		}
	}
	if l.Limit.Cost > 0 {
		fit := int64(-1)
		switch left := l.Limit.Cost - committed.Cost - worst(0).Cost; {
		case r.Prices == nil:
			// Nothing prices it: never sent under a cost budget.
		case left < 0:
		case r.Prices.Output == 0:
			fit = out
		default:
			fit = floorDiv(int64(math.Min(math.Floor(left*1e6/r.Prices.Output), MaxBudgetTokens)), n)
		}
		if fit < out {
			out, why = fit, WhyCostBudget
		}
	}
	least := int64(min(want, MinMaxTokens))
	// The division above can be a rounding off in cost: a step or two
	// down finds what Fits accepts.
	for i := 0; i < 4 && out >= least; i, out = i+1, out-1 {
		if fits, _ := l.Fits(worst(out)); fits {
			if out < int64(want) && change == "" {
				change = MaxTokensLowered
			}
			return grant{maxTokens: int(out), change: change, worst: worst(out)}, true, ""
		}
	}
	if why == "" {
		_, why = l.Fits(worst(least))
	}
	return grant{maxTokens: int(least), change: change, worst: worst(least)}, false, why
}

// floorDiv is a/b rounded down, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// spendOf is what usage u spends: its tokens, at prices p (nil: no cost).
func spendOf(u providers.Usage, p *providers.Prices) Spend {
	s := Spend{Tokens: int64(u.Tokens())}
	if p != nil {
		s.Cost = p.Cost(u)
	}
	return s
}

// heldUntilVerdict reports that an attempt of class c keeps its
// reservation until what follows it is known: an ambiguous attempt (and
// a canceled one while the scope is open, which awaits a verdict too)
// may have run, and only a verdict says whether.
func heldUntilVerdict(c evidence.Class) bool {
	return c == evidence.Ambiguous || c == evidence.Canceled
}

// chargeOf is what an ended attempt counts against the budget
// (docs/contract.md section 4.3): the provider's usage when it reported
// any (for a streamed partial, what was delivered); nothing when the
// request provably never ran (a replay-safe class: the provider did not
// execute it; or nothing left the client); otherwise its worst case,
// which it keeps. Every stream a lower layer re-sent it on may have run
// too, and is charged its worst case on top.
func chargeOf(c evidence.Classification, ev evidence.Evidence, usage *providers.Usage, p *providers.Prices, worst Spend) Spend {
	var s Spend
	switch {
	case usage != nil && usage.Reported():
		s = spendOf(*usage, p)
	case c.Class.ReplaySafe(), ev.Activity == "" && !ev.RequestSent && !ev.MaybeSent:
		return Spend{}
	default:
		s = worst
	}
	for range ev.TransportReplays {
		s = s.Add(worst)
	}
	return s
}

// chargeAfterVerdict is what an ambiguous attempt counts once its
// verdict is in (docs/contract.md section 5.2): for completed, the usage
// of the verdict's response (else the attempt's own, else its worst
// case); nothing for not_executed; its worst case for allow_replay,
// abandon, a timeout or a scope that ended while it waited.
func chargeAfterVerdict(v attempt.Verdict, answer *providers.Response, usage *providers.Usage, p *providers.Prices, worst Spend) Spend {
	switch v {
	case attempt.VerdictCompleted:
		switch {
		case answer != nil && answer.Usage.Reported():
			return spendOf(answer.Usage, p)
		case usage != nil && usage.Reported():
			return spendOf(*usage, p)
		}
		return worst
	case attempt.VerdictNotExecuted:
		return Spend{}
	}
	return worst
}

// notSentNote says why the next attempt, on route, was not sent: its
// least worst case against what the budget had committed.
func notSentNote(route string, g grant, l Ledger) string {
	c := l.Committed()
	msg := fmt.Sprintf("the next attempt on %s was not sent: its worst case (%d tokens", route, g.worst.Tokens)
	if l.Limit.Cost > 0 {
		msg += fmt.Sprintf(", cost %.6g", g.worst.Cost)
	}
	msg += ", with max_tokens " + fmt.Sprint(g.maxTokens) + ") does not fit the budget ("
	if l.Limit.Tokens > 0 {
		msg += fmt.Sprintf("%d of %d tokens committed", c.Tokens, l.Limit.Tokens)
		if l.Limit.Cost > 0 {
			msg += ", "
		}
	}
	if l.Limit.Cost > 0 {
		msg += fmt.Sprintf("cost %.6g of %.6g committed", c.Cost, l.Limit.Cost)
	}
	return msg + ")"
}
