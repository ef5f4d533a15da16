package workflows

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

// The rules of docs/contract.md section 4 (and the verdicts of 5.2), one
// row each, through the one function that decides what follows an
// attempt. Each attempt is classified by the real evidence.Classify from
// its evidence.
func TestDecideWalksEveryRuleOfTheContract(t *testing.T) {
	routes := []attempt.RouteInfo{
		{Name: "a", Capabilities: providers.Capabilities{ContextTokens: 8000}},
		{Name: "b", Capabilities: providers.Capabilities{ContextTokens: 8000}},
		{Name: "c", Capabilities: providers.Capabilities{ContextTokens: 128000}},
	}
	// at is a position on route a with everything to spare.
	at := func(adjust ...func(*position)) position {
		p := position{used: 1, budget: 4, routes: routes, retriesPerRoute: 1, jitter: 0.5, remaining: 5 * time.Minute, avoid: []string{"old"}}
		for _, f := range adjust {
			f(&p)
		}
		return p
	}
	onLast := func(p *position) { p.route = len(routes) - 1 }
	triedOnce := func(p *position) { p.tries = 1 }
	spent := func(p *position) { p.used = p.budget }
	// broke has a token budget no attempt fits; rich one every attempt
	// fits; holding has a reservation still held (an ambiguous attempt's).
	broke := func(p *position) { p.ledger, p.sizing = &Ledger{Limit: Budget{Tokens: 100}}, newSizing(hello) }
	rich := func(p *position) { p.ledger, p.sizing = &Ledger{Limit: Budget{Tokens: 1_000_000}}, newSizing(hello) }
	holding := func(p *position) {
		p.ledger, p.sizing = &Ledger{Limit: Budget{Tokens: 4100}, Holds: []Hold{{ID: "run-1", Spend: Spend{Tokens: 4000}}}}, newSizing(hello)
	}
	ev := func(f func(*evidence.Evidence)) evidence.Evidence {
		e := evidence.Evidence{ConnRef: "p-c1", RequestSent: true, StreamID: 3}
		f(&e)
		return e
	}
	var (
		completed   = ev(func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true })
		partial     = ev(func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true; e.BodyFailed = true })
		lostPartial = ev(func(e *evidence.Evidence) { e.Activity = evidence.ActivityWorkerLost; e.ContentStarted = true })
		rejected    = ev(func(e *evidence.Evidence) { e.Status = 400 })
		filtered    = ev(func(e *evidence.Evidence) { e.Status = 400; e.Signal = evidence.SignalContentFiltered })
		first421    = ev(func(e *evidence.Evidence) { e.Status = 421 })
		second421   = ev(func(e *evidence.Evidence) { e.Status = 421; e.AfterMisdirected = true })
		goAwayAbove = ev(func(e *evidence.Evidence) { e.GoAway = &evidence.GoAway{LastStreamID: 1} })
		goAwayProto = ev(func(e *evidence.Evidence) {
			e.GoAway = &evidence.GoAway{LastStreamID: 1, Code: evidence.CodeProtocolError}
		})
		mismatch   = ev(func(e *evidence.Evidence) { e.RequestSent, e.ProtocolMismatch = false, evidence.MismatchHTTP11 })
		dialFailed = ev(func(e *evidence.Evidence) { e.ConnRef, e.RequestSent, e.DialFailed = "", false, true })
		throttled  = ev(func(e *evidence.Evidence) { e.Status = 429; e.RetryAfter = time.Second })
		pushedAway = ev(func(e *evidence.Evidence) { e.Status = 429; e.RetryAfter = time.Hour })
		upstream   = ev(func(e *evidence.Evidence) { e.Status = 500 })
		empty      = ev(func(e *evidence.Evidence) { e.Status = 200; e.Signal = evidence.SignalEmptyResponse })
		modelGone  = ev(func(e *evidence.Evidence) { e.Status = 404; e.Signal = evidence.SignalModelNotFound })
		tooLong    = ev(func(e *evidence.Evidence) { e.Status = 400; e.Signal = evidence.SignalContextTooLong })
		connLost   = ev(func(e *evidence.Evidence) { e.ConnClosed = true })
		canceled   = ev(func(e *evidence.Evidence) { e.Canceled, e.Stop = true, evidence.StopScope })
	)
	type want struct {
		next   string
		why    string // a prefix
		end    State
		route  string // of the next attempt
		fresh  bool
		wait   bool // a backoff before the next attempt
		avoids string
		notes  int
		// granted: the next attempt was sized against the budget.
		granted bool
	}
	for _, tt := range []struct {
		rule string
		ev   evidence.Evidence
		p    position
		want want
	}{
		// 4.2: what each class leads to.
		{"completed: completed", completed, at(), want{next: DecideFinish, end: StateCompleted}},
		{"committed_partial: completed_partial", partial, at(), want{next: DecideFinish, end: StateCompletedPartial}},
		{"rejected: rejected, no fallback", rejected, at(), want{next: DecideStop, end: StateRejected}},
		{"content_filtered: rejected, never a fallback", filtered, at(), want{next: DecideStop, end: StateRejected}},
		{"misdirected: at once, same route, fresh connection", first421, at(), want{next: DecideRetry, route: "a", fresh: true, avoids: "p-c1"}},
		{"misdirected_repeated: failed", second421, at(), want{next: DecideStop, end: StateFailed}},
		{"refused: at once, same route, avoiding the connection", goAwayAbove, at(), want{next: DecideRetry, route: "a", avoids: "p-c1"}},
		{"refused, misconfigured route: the next route", goAwayProto, at(), want{next: DecideFallback, route: "b"}},
		{"refused, misconfigured route, none left: failed", goAwayProto, at(onLast), want{next: DecideStop, why: "goaway_PROTOCOL_ERROR: no route to fall back to", end: StateFailed}},
		{"unsent: back off, same route", dialFailed, at(), want{next: DecideRetry, route: "a", wait: true}},
		{"unsent, retries_per_route spent: the next route", dialFailed, at(triedOnce), want{next: DecideFallback, route: "b"}},
		{"unsent, retries spent, no route to fall back to: same route", dialFailed, at(triedOnce, onLast), want{next: DecideRetry, route: "c", wait: true}},
		{"unsent, protocol mismatch: fall back only", mismatch, at(), want{next: DecideFallback, route: "b"}},
		{"throttled: back off by Retry-After, same route", throttled, at(), want{next: DecideRetry, route: "a", wait: true}},
		{"throttled beyond the deadline: fall back at once", pushedAway, at(), want{next: DecideFallback, route: "b"}},
		{"throttled beyond the deadline, no route: failed", pushedAway, at(onLast), want{next: DecideStop, why: "retry_after_beyond_deadline", end: StateFailed}},
		{"upstream_error: back off, same route", upstream, at(), want{next: DecideRetry, route: "a", wait: true}},
		{"empty_response: the next route", empty, at(), want{next: DecideFallback, route: "b"}},
		{"empty_response, none left: failed", empty, at(onLast), want{next: DecideStop, end: StateFailed}},
		{"incompatible_route: the next route", modelGone, at(), want{next: DecideFallback, route: "b"}},
		{"ambiguous: awaiting a verdict", connLost, at(), want{next: DecideAwait, avoids: ""}},
		{"ambiguous under the replay policy: replay, same route", connLost, at(func(p *position) { p.mayReplay = true }), want{next: DecideReplay, route: "a"}},
		{"canceled with the scope open: treated as ambiguous", canceled, at(), want{next: DecideAwait}},
		// 4.3: one budget.
		{"budget spent: no retry", dialFailed, at(spent), want{next: DecideStop, why: "budget_exhausted", end: StateFailed}},
		{"budget spent: no transport retry", goAwayAbove, at(spent), want{next: DecideStop, why: "budget_exhausted", end: StateFailed}},
		{"budget spent: no fallback", empty, at(spent), want{next: DecideStop, why: "budget_exhausted", end: StateFailed}},
		// 4.3: the spend budget, after the attempt budget.
		{"spend: a retry whose worst case does not fit is not sent", upstream, at(broke), want{next: DecideStop, why: WhyTokenBudget, end: StateSpendExhausted, notes: 1}},
		{"spend: nor a transport retry", goAwayAbove, at(broke), want{next: DecideStop, why: WhyTokenBudget, end: StateSpendExhausted, notes: 1}},
		{"spend: nor a fallback", empty, at(broke), want{next: DecideStop, why: WhyTokenBudget, end: StateSpendExhausted, notes: 1}},
		{"spend: nor a 421 retry", first421, at(broke), want{next: DecideStop, why: WhyTokenBudget, end: StateSpendExhausted, notes: 1}},
		{"spend: a retry that fits is sized", upstream, at(rich), want{next: DecideRetry, route: "a", wait: true, granted: true}},
		{"spend: a fallback that fits is sized", empty, at(rich), want{next: DecideFallback, route: "b", granted: true}},
		{"spend: an ambiguous attempt awaits its verdict whatever is left", connLost, at(broke), want{next: DecideAwait}},
		{"spend: a replay is sized with the ambiguous attempt's reservation held", connLost, at(holding, func(p *position) { p.mayReplay = true }), want{next: DecideStop, why: WhyTokenBudget, end: StateSpendExhausted, notes: 1}},
		{"spend: the attempt budget is asked first", dialFailed, at(spent, broke), want{next: DecideStop, why: "budget_exhausted", end: StateFailed}},
		{"spend: a response that committed stands", completed, at(broke), want{next: DecideFinish, end: StateCompleted}},
		// 4.5: the scope.
		{"scope ended: canceled, whatever the class", dialFailed, at(func(p *position) { p.origin = OriginUserStop }), want{next: DecideStop, why: "scope_ended_user_stop", end: StateCanceled}},
		{"scope ended as the response committed: the response stands", completed, at(func(p *position) { p.origin = OriginUserStop }), want{next: DecideFinish, end: StateCompleted}},
		// 4.6: fallback by capability.
		{"context too long: only a route declaring a larger context", tooLong, at(), want{next: DecideFallback, route: "c", notes: 1}},
		{"context too long, none larger: failed", tooLong, at(func(p *position) { p.route = 1; p.routes = routes[:2] }), want{next: DecideStop, end: StateFailed}},
		// 5.5: a partial whose worker was lost asks the journal first.
		{"committed on a lost worker: completed_partial, the journal asked", lostPartial, at(), want{next: DecideFinish, end: StateCompletedPartial}},
	} {
		t.Run(tt.rule, func(t *testing.T) {
			c := evidence.Classify(tt.ev)
			pl := decide(c, tt.ev, tt.p)
			w := tt.want
			if pl.d.Next != w.next || !strings.HasPrefix(pl.d.Why, w.why) || pl.end != w.end {
				t.Fatalf("%s/%s: decision %+v end %q; want %s %q… end %q", c.Class, c.Reason, pl.d, pl.end, w.next, w.why, w.end)
			}
			if w.end == "" && w.next != DecideAwait {
				if got := tt.p.routes[pl.route].Name; got != w.route || pl.d.Route != w.route {
					t.Fatalf("next route %s (decision %s), want %s", got, pl.d.Route, w.route)
				}
				if pl.attempt.fresh != w.fresh || (pl.d.Wait > 0) != w.wait || pl.attempt.wait != pl.d.Wait {
					t.Fatalf("next attempt %+v decision %+v; want fresh %v wait %v", pl.attempt, pl.d, w.fresh, w.wait)
				}
			}
			if w.avoids != "" && !slices.Contains(pl.attempt.avoid, w.avoids) {
				t.Fatalf("the next attempt avoids %v, want %s too", pl.attempt.avoid, w.avoids)
			}
			if len(pl.notes) != w.notes {
				t.Fatalf("notes %v, want %d", pl.notes, w.notes)
			}
			if (pl.attempt.grant != nil) != w.granted {
				t.Fatalf("next attempt's grant %+v, want one: %v", pl.attempt.grant, w.granted)
			}
			if pl.misdirected != (c.Class == evidence.Misdirected) {
				t.Fatalf("misdirected %v for %s", pl.misdirected, c.Class)
			}
			if pl.askJournal != (tt.ev.Activity != "" && pl.end == StateCompletedPartial) {
				t.Fatalf("askJournal %v", pl.askJournal)
			}
		})
	}
}

// Section 5.2: what each verdict leads to, on the attempt that awaited it.
func TestDecideVerdictAppliesEachVerdict(t *testing.T) {
	c := evidence.Classify(evidence.Evidence{RequestSent: true, ConnClosed: true})
	p := position{used: 1, budget: 4, routes: []attempt.RouteInfo{{Name: "a"}}, avoid: []string{"p-c1"}}
	for _, tt := range []struct {
		verdict attempt.Verdict
		used    int
		end     State
		reason  string
	}{
		{attempt.VerdictCompleted, 1, StateReconciled, "reconciled"},
		{attempt.VerdictNotExecuted, 1, "", ""},
		{attempt.VerdictAllowReplay, 1, "", ""},
		{attempt.VerdictAbandon, 1, StateIndeterminate, "abandoned"},
		{attempt.VerdictNotExecuted, 4, StateFailed, "budget_exhausted"},
		{attempt.VerdictNotExecuted, -1, StateSpendExhausted, WhyTokenBudget},
		{attempt.VerdictAllowReplay, -1, StateSpendExhausted, WhyTokenBudget},
	} {
		q := p
		q.used = tt.used
		if tt.used < 0 {
			// -1: within max_attempts, but no attempt fits the tokens.
			q.used, q.ledger, q.sizing = 1, &Ledger{Limit: Budget{Tokens: 100}}, newSizing(hello)
		}
		pl := decideVerdict(tt.verdict, c, q)
		if pl.end != tt.end || pl.reason != tt.reason {
			t.Fatalf("%s at %d used: end %q reason %q, want %q %q", tt.verdict, tt.used, pl.end, pl.reason, tt.end, tt.reason)
		}
		if tt.end == "" && (pl.route != 0 || !slices.Contains(pl.attempt.avoid, "p-c1") || !strings.Contains(pl.attempt.why, string(tt.verdict))) {
			t.Fatalf("%s: next attempt %+v on route %d", tt.verdict, pl.attempt, pl.route)
		}
	}
}
