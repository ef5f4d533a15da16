package workflows

import (
	"fmt"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
)

// This file is the one place that maps a classified attempt to what
// happens next (docs/contract.md sections 4 and 5.2). decide and
// decideVerdict are pure: the workflow gathers where the action stands
// (position), asks, and applies the answer (a plan) in step; the waits
// (reconciler, verdict, backoff) are the workflow's, elsewhere. The class
// itself was decided by evidence.Classify; nothing here revisits it.

// position is where an action stands when one of its attempts has ended:
// everything decide needs besides the attempt's own classification and
// evidence.
type position struct {
	// origin is the scope's end, empty while it is open.
	origin CancelOrigin
	// used is the attempts charged so far (this one and its transport
	// replays included); budget is max_attempts.
	used, budget int
	// routes are the action's routes, in order; route is the current
	// one's index, tries the retries it has had.
	routes          []attempt.RouteInfo
	route, tries    int
	retriesPerRoute int
	// waits is the backoff waits so far; the next one is computed from
	// backoff, jitter (the attempt's deterministic random number) and
	// remaining (the time left before the deadline).
	waits     int
	backoff   Backoff
	jitter    float64
	remaining time.Duration
	// avoid is the connections the current attempt was told to avoid.
	avoid []string
	// mayReplay says the replay policy allows replaying this attempt
	// (section 5.4: route, window, not committed).
	mayReplay bool
	// ledger is the action's budget with this attempt settled (or still
	// held, when ambiguous), nil without a budget; sizing is the
	// request's part of the next attempt's worst case.
	ledger *Ledger
	sizing sizing
}

// plan is what follows one attempt: the decision the attempt's record
// keeps, and what the workflow does to carry it out.
type plan struct {
	d Decision
	// For DecideFinish and DecideStop: the terminal state, its outcome
	// and its reason.
	end             State
	outcome, reason string
	// For DecideRetry, DecideFallback and DecideReplay: how the next
	// attempt is made and where the cursor moves.
	attempt      nextAttempt
	route, tries int
	waits        int
	// misdirected: this attempt's 421 makes any later one repeated.
	misdirected bool
	// askJournal: the partial committed on a worker that was lost, whose
	// text history does not hold; the worker's reconciler may have it
	// whole (section 5.5).
	askJournal bool
	// notes says why routes were passed over for a fallback.
	notes []string
}

// answers are the terminal states a class ends the action in by itself
// (section 4.2): a response, or a request that can never succeed.
var answers = map[evidence.Class]State{
	evidence.Completed:           StateCompleted,
	evidence.CommittedPartial:    StateCompletedPartial,
	evidence.Rejected:            StateRejected,
	evidence.ContentFiltered:     StateRejected,
	evidence.MisdirectedRepeated: StateFailed,
}

// decide applies the contract's next-step table (section 4.2), with the
// budgets (4.3: attempts, then tokens and cost), the scope (4.5),
// fallback by capability (4.6), the 421 rule (4.7) and the replay policy
// (5.4), to one attempt.
func decide(c evidence.Classification, ev evidence.Evidence, p position) plan {
	from := p.routes[p.route]
	end, terminal := answers[c.Class]
	finished := end == StateCompleted || end == StateCompletedPartial
	if p.origin != "" && !finished {
		// The scope ended: whatever the attempt says, nothing follows.
		// A response that committed stands.
		return stop(Decision{Next: DecideStop, Why: "scope_ended_" + string(p.origin)}, StateCanceled, string(evidence.Canceled), string(p.origin))
	}
	avoid := p.avoid
	if ev.ConnRef != "" && (c.FreshConnection || ev.GoAway != nil) {
		avoid = appendUnique(avoid, ev.ConnRef)
	}
	// again makes one more attempt, as d and nx say, within the budgets.
	again := func(d Decision, nx nextAttempt, route, tries int) plan {
		if p.used >= p.budget {
			return stop(Decision{Next: DecideStop, Why: "budget_exhausted"}, StateFailed, string(c.Class), "budget_exhausted")
		}
		if pl, fits := p.spendFor(&nx, route, string(c.Class)); !fits {
			return pl
		}
		return plan{d: d, attempt: nx, route: route, tries: tries, waits: p.waits}
	}
	// fallBackOrStop moves to the next route that can serve, or ends the
	// action when there is none.
	fallBackOrStop := func() plan {
		j, ok, notes := fallbackFrom(p.routes, p.route, c)
		var pl plan
		if ok {
			pl = again(Decision{Next: DecideFallback, Why: c.Reason, Route: p.routes[j].Name},
				nextAttempt{why: "fallback", detail: "after " + c.Reason + " on " + from.Name}, j, 0)
		} else {
			pl = stop(Decision{Next: DecideStop, Why: c.Reason + ": no route to fall back to"}, StateFailed, string(c.Class), c.Reason+": no route to fall back to")
		}
		pl.notes = append(notes, pl.notes...)
		return pl
	}

	switch {
	case finished:
		return plan{d: Decision{Next: DecideFinish, Why: c.Reason}, end: end, outcome: string(c.Class), reason: c.Reason,
			askJournal: end == StateCompletedPartial && ev.Activity != ""}
	case terminal:
		return stop(Decision{Next: DecideStop, Why: c.Reason}, end, string(c.Class), c.Reason)

	case c.Class == evidence.Ambiguous || c.Class == evidence.Canceled:
		// A canceled attempt with the scope still open is never expected
		// (only the workflow asks Temporal to cancel one); the request
		// may have left, so it waits for a verdict too (section 3.2).
		if c.Class == evidence.Ambiguous && p.mayReplay {
			return again(Decision{Next: DecideReplay, Why: "route honours Idempotency-Key", Route: from.Name},
				nextAttempt{why: "replay", detail: "route honours Idempotency-Key", avoid: avoid}, p.route, p.tries)
		}
		// The verdict decides; avoid goes to an attempt it allows.
		return plan{d: Decision{Next: DecideAwait, Why: c.Reason}, attempt: nextAttempt{avoid: avoid}}

	case c.RouteMisconfigured:
		// The same route would fail the same way; the unprocessed request
		// may go elsewhere.
		return fallBackOrStop()
	case c.Class == evidence.Misdirected:
		pl := again(Decision{Next: DecideRetry, Why: "fresh connection after 421", Route: from.Name},
			nextAttempt{why: "421 retry", detail: "fresh connection after 421", avoid: avoid, fresh: true}, p.route, p.tries)
		pl.misdirected = true
		return pl
	case c.Class == evidence.Refused:
		// Provably unprocessed: at once, on another connection.
		return again(Decision{Next: DecideRetry, Why: c.Reason, Route: from.Name},
			nextAttempt{why: "transport retry", detail: freshDetail(ev), avoid: avoid}, p.route, p.tries)
	case c.Class == evidence.EmptyResponse || c.Class == evidence.IncompatibleRoute:
		// The same route would answer the same.
		return fallBackOrStop()
	}

	// unsent, throttled, upstream_error: back off, then the same route
	// while it has retries left or there is nowhere to fall back to.
	j, canFall, notes := fallbackFrom(p.routes, p.route, c)
	same := p.tries < p.retriesPerRoute || !canFall
	waits := p.waits + 1
	wait, waitOK := p.backoff.Delay(waits, p.jitter, c.RetryAfter, p.remaining)
	var pl plan
	switch {
	case same && waitOK:
		pl = again(Decision{Next: DecideRetry, Why: c.Reason, Route: from.Name, Wait: wait},
			nextAttempt{why: "retry", detail: "after " + c.Reason, avoid: avoid, wait: wait}, p.route, p.tries+1)
	case canFall:
		// A different provider need not wait out this one's pushback.
		pl = again(Decision{Next: DecideFallback, Why: c.Reason, Route: p.routes[j].Name},
			nextAttempt{why: "fallback", detail: "after " + c.Reason + " on " + from.Name}, j, 0)
	default:
		pl = stop(Decision{Next: DecideStop, Why: "retry_after_beyond_deadline"}, StateFailed, string(c.Class), "retry_after_beyond_deadline")
	}
	pl.waits, pl.notes = waits, append(notes, pl.notes...)
	return pl
}

// decideVerdict applies a verdict on the attempt that awaited it
// (section 5.2). The attempt's decision stays await_reconciliation (its
// record and its one event already say so), so the plan carries none.
func decideVerdict(v attempt.Verdict, c evidence.Classification, p position) plan {
	switch v {
	case attempt.VerdictCompleted:
		return plan{end: StateReconciled, outcome: string(attempt.VerdictCompleted), reason: "reconciled"}
	case attempt.VerdictNotExecuted, attempt.VerdictAllowReplay:
		if p.used >= p.budget {
			return plan{end: StateFailed, outcome: string(c.Class), reason: "budget_exhausted"}
		}
		nx := nextAttempt{why: "retry after verdict " + string(v), avoid: p.avoid}
		if pl, fits := p.spendFor(&nx, p.route, string(c.Class)); !fits {
			pl.d = Decision{}
			return pl
		}
		return plan{attempt: nx, route: p.route, tries: p.tries, waits: p.waits}
	default: // abandon
		return plan{end: StateIndeterminate, outcome: string(evidence.Ambiguous), reason: "abandoned"}
	}
}

// spendFor sizes the next attempt, on route, against the action's
// budget: it gives nx its grant (the output bound it is sent with and the
// worst case to reserve), or, when the worst case does not fit, the plan
// that ends the action spend_exhausted without sending it. outcome is the
// class of the attempt that ended.
func (p position) spendFor(nx *nextAttempt, route int, outcome string) (plan, bool) {
	if p.ledger == nil {
		return plan{}, true
	}
	g, ok, why := grantFor(*p.ledger, p.sizing, p.routes[route])
	if !ok {
		pl := stop(Decision{Next: DecideStop, Why: why}, StateSpendExhausted, outcome, why)
		pl.notes = []string{notSentNote(p.routes[route].Name, g, *p.ledger)}
		return pl, false
	}
	nx.grant = &g
	return plan{}, true
}

func stop(d Decision, s State, outcome, reason string) plan {
	return plan{d: d, end: s, outcome: outcome, reason: reason}
}

// fallbackFrom finds the route to fall back to from route ri after c: the
// next one in order, and after context_length_exceeded the next one that
// declares a larger context than ri's (a route that declares none is no
// evidence of a larger one, section 4.6). notes says why routes were
// passed over.
func fallbackFrom(routes []attempt.RouteInfo, ri int, c evidence.Classification) (j int, ok bool, notes []string) {
	larger := c.Class == evidence.IncompatibleRoute && c.Reason == string(evidence.SignalContextTooLong)
	for j := ri + 1; j < len(routes); j++ {
		if larger && routes[j].Capabilities.ContextTokens <= routes[ri].Capabilities.ContextTokens {
			notes = append(notes, fmt.Sprintf("route %s skipped for fallback: context_tokens %d is not larger than %s's %d", routes[j].Name, routes[j].Capabilities.ContextTokens, routes[ri].Name, routes[ri].Capabilities.ContextTokens))
			continue
		}
		return j, true, notes
	}
	return 0, false, notes
}

func appendUnique(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(append([]string(nil), s...), v)
}
