package workflows

import (
	"log/slog"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/providers"
)

// The workflow's side of usage and the budget (budget.go holds the pure
// rules): recording what attempts used, reserving before an attempt and
// settling after it.

// routeInfo is the described route called name.
func (w *action) routeInfo(name string) attempt.RouteInfo {
	for _, r := range w.plan.Routes {
		if r.Name == name {
			return r
		}
	}
	return attempt.RouteInfo{Name: name}
}

// reserve holds the attempt's worst case, as the decision that made it
// sized it on this same ledger (grantFor), and records it; it returns
// the request to send, with the output bound the budget gave it.
func (w *action) reserve(rec *AttemptRecord, g *grant) providers.Request {
	if g == nil || w.status.Ledger == nil {
		return w.in.Request
	}
	w.status.Ledger.hold(w.attemptID(rec.N), g.worst)
	rec.Reservation = &Reservation{Worst: g.worst, MaxTokens: g.maxTokens, MaxTokensChange: g.change}
	if g.change == "" {
		return w.in.Request
	}
	return w.in.Request.WithMaxOutputTokens(g.maxTokens)
}

// recordUsage puts usage u (nil: none) on attempt n's record with its
// cost, and adds it to the action's total.
func (w *action) recordUsage(n int, u *providers.Usage) {
	if u == nil || !u.Reported() {
		return
	}
	rec := w.attemptRecord(n)
	if rec.Usage != nil {
		// Replaced (a verdict's answer for an attempt that had
		// reported some): the total counts it once.
		w.status.Usage = w.status.Usage.Add(providers.Usage{
			PromptTokens: -rec.Usage.PromptTokens, CompletionTokens: -rec.Usage.CompletionTokens, TotalTokens: -rec.Usage.TotalTokens,
			CachedTokens: -rec.Usage.CachedTokens, CacheWriteTokens: -rec.Usage.CacheWriteTokens,
		})
		w.status.Cost -= rec.Cost
	}
	usage := *u
	rec.Usage, rec.Cost = &usage, 0
	if p := w.routeInfo(rec.Route).Prices; p != nil {
		rec.Cost = p.Cost(usage)
	}
	w.status.Usage = w.status.Usage.Add(usage)
	w.status.Cost += rec.Cost
}

// chargeOf is what attempt rec counts against the budget as it ended.
func (w *action) chargeOf(rec AttemptRecord) Spend {
	if rec.Reservation == nil {
		return Spend{}
	}
	return chargeOf(rec.Classification, rec.Evidence, rec.Usage, w.routeInfo(rec.Route).Prices, rec.Reservation.Worst)
}

// settle charges attempt n s, releasing its reservation; settling again
// corrects the charge.
func (w *action) settle(n int, s Spend) {
	l, rec := w.status.Ledger, w.attemptRecord(n)
	if l == nil || rec.Reservation == nil {
		return
	}
	if was := rec.Reservation.Charged; was != nil {
		l.Resettle(*was, s)
	} else {
		l.Settle(w.attemptID(n), s)
	}
	rec.Reservation.Charged = &s
}

// settleVerdict settles the attempt a verdict (or its absence: v empty)
// was about, recording the usage of a completed verdict's answer.
func (w *action) settleVerdict(n int, v attempt.Verdict, answer *providers.Response) {
	rec := w.attemptRecord(n)
	if v == attempt.VerdictCompleted && answer != nil {
		w.recordUsage(n, &answer.Usage)
	}
	if rec.Reservation == nil {
		return
	}
	w.settle(n, chargeAfterVerdict(v, answer, rec.Usage, w.routeInfo(rec.Route).Prices, rec.Reservation.Worst))
}

// spendAttrs are the usage, cost and reservation of an attempt's record,
// for its "llm.attempt" event: the event says what the record says.
func spendAttrs(rec AttemptRecord) []slog.Attr {
	var a []slog.Attr
	if u := rec.Usage; u != nil {
		a = append(a, slog.Int("gen_ai.usage.input_tokens", u.PromptTokens), slog.Int("gen_ai.usage.output_tokens", u.CompletionTokens))
		if u.CachedTokens > 0 {
			a = append(a, slog.Int("cached_input_tokens", u.CachedTokens))
		}
		if u.CacheWriteTokens > 0 {
			a = append(a, slog.Int("cache_write_input_tokens", u.CacheWriteTokens))
		}
		if rec.Cost > 0 {
			a = append(a, slog.Float64("cost", rec.Cost))
		}
	}
	if r := rec.Reservation; r != nil {
		a = append(a, slog.Int64("reserved_tokens", r.Worst.Tokens), slog.Int("max_tokens", r.MaxTokens))
		if r.Worst.Cost > 0 {
			a = append(a, slog.Float64("reserved_cost", r.Worst.Cost))
		}
		if r.MaxTokensChange != "" {
			a = append(a, slog.String("max_tokens_change", r.MaxTokensChange))
		}
		if c := r.Charged; c != nil {
			a = append(a, slog.Int64("charged_tokens", c.Tokens), slog.Float64("charged_cost", c.Cost))
		} else {
			a = append(a, slog.Bool("reservation_held", true))
		}
	}
	return a
}
