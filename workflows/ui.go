package workflows

import (
	"fmt"
	"strconv"
	"strings"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
)

// Search attributes the workflow keeps current. They are keywords so
// "all actions awaiting reconciliation" is one query:
//
//	DurallmState = "awaiting_reconciliation"
var (
	AttrState   = temporal.NewSearchAttributeKeyKeyword("DurallmState")
	AttrOutcome = temporal.NewSearchAttributeKeyKeyword("DurallmOutcome")
	AttrRoute   = temporal.NewSearchAttributeKeyKeyword("DurallmRoute")
)

// SearchAttributes lists the search attributes to register in a namespace
// (all Keyword), for servers the project sets up itself.
var SearchAttributes = map[string]enumspb.IndexedValueType{
	"DurallmState":   enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	"DurallmOutcome": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	"DurallmRoute":   enumspb.INDEXED_VALUE_TYPE_KEYWORD,
}

// setState moves the state and keeps the search attributes and current
// details in step.
func (w *action) setState(s State, outcome, route string) {
	prev := w.status.State
	w.status.State = s
	w.tellParent(prev, s)
	updates := []temporal.SearchAttributeUpdate{AttrState.ValueSet(string(s))}
	if outcome != "" {
		updates = append(updates, AttrOutcome.ValueSet(outcome))
	}
	if route != "" {
		updates = append(updates, AttrRoute.ValueSet(route))
	}
	// Queued is never seen (see attempt.StateUpsertsSkipQueued); the
	// plan says whether this history upserted it.
	skip := s == StateQueued && w.plan.StateUpserts >= attempt.StateUpsertsSkipQueued
	if w.plan.SearchAttributes && !skip {
		if err := workflow.UpsertTypedSearchAttributes(w.ctx, updates...); err != nil {
			w.log.Warn("search attribute update failed", "error", err)
		}
	}
	w.details()
}

// details writes the timeline as the workflow's current details, shown in
// the Temporal UI.
func (w *action) details() {
	var b strings.Builder
	fmt.Fprintf(&b, "**%s**", w.status.State)
	if w.status.Reason != "" {
		fmt.Fprintf(&b, " (%s)", w.status.Reason)
	}
	fmt.Fprintf(&b, " · %d of %d attempts", w.status.Used, w.status.Budget)
	if l := w.status.Ledger; l != nil {
		c := l.Committed()
		if l.Limit.Tokens > 0 {
			fmt.Fprintf(&b, " · %d of %d tokens", c.Tokens, l.Limit.Tokens)
		}
		if l.Limit.Cost > 0 {
			fmt.Fprintf(&b, " · cost %.6g of %.6g", c.Cost, l.Limit.Cost)
		}
	} else if w.status.Usage.Reported() {
		fmt.Fprintf(&b, " · %d tokens", w.status.Usage.Tokens())
	}
	b.WriteString("\n\n")
	if len(w.status.Attempts) > 0 {
		b.WriteString("| # | route | why | class | reason | conn | stream | status | journal | verdict |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range w.status.Attempts {
			verdict := string(r.Verdict)
			if r.VerdictBy != "" {
				verdict += " by " + r.VerdictBy
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %d | %d | %s | %s |\n", r.N, r.Route, r.Why,
				r.Classification.Class, r.Classification.Reason, r.Evidence.ConnRef, r.Evidence.StreamID, r.Evidence.Status,
				r.JournalState, verdict)
		}
	}
	if w.status.AwaitingAttempt > 0 {
		fmt.Fprintf(&b, "\nAwaiting a reconcile verdict for attempt %d.\n", w.status.AwaitingAttempt)
	}
	workflow.SetCurrentDetails(w.ctx, b.String())
}

// summary is the one-line activity summary shown in the UI, e.g.
// "attempt 2 · transport retry · openai/gpt-4o-mini · fresh connection after GOAWAY last=41".
func summary(n int, nx nextAttempt, r attempt.RouteInfo) string {
	parts := []string{"attempt " + strconv.Itoa(n), nx.why, r.Kind + "/" + r.Model}
	if nx.detail != "" {
		parts = append(parts, nx.detail)
	}
	if g := nx.grant; g != nil && g.change != "" {
		parts = append(parts, "max_tokens "+strconv.Itoa(g.maxTokens)+" ("+g.change+" by the budget)")
	}
	return strings.Join(parts, " · ")
}

func freshDetail(ev evidence.Evidence) string {
	switch {
	case ev.GoAway != nil:
		return fmt.Sprintf("fresh connection after GOAWAY last=%d", ev.GoAway.LastStreamID)
	case ev.RSTStream != nil:
		return "fresh connection after RST_STREAM " + ev.RSTStream.String()
	default:
		return "fresh connection"
	}
}

func routeNames(rs []attempt.RouteInfo) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Name
	}
	return strings.Join(names, ", ")
}
