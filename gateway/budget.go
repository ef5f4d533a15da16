package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.temporal.io/sdk/temporal"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/callerbudget"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// This file is the callers' budgets (docs/contract.md section 6.5,
// docs/gateway.md "Caller budgets"): before an action of a caller with a
// budget starts, the gateway reserves the request's part of what the
// caller's limit leaves in the current period, and the action runs with
// that part as its own budget, so it can commit no more; when it ends,
// its hold is settled at what it committed. The request that cannot fit
// is refused before anything starts.

// Defaults of the spend ledger's upkeep (Options.SpendSweep).
const (
	// DefaultSpendSweep is how often a gateway looks for holds that no
	// gateway is settling (one that stopped while its action ran). A
	// sweep looks at holds two sweeps old (2 minutes by default: past a
	// start's bound and the minute a gateway keeps trying to cancel a
	// start it could not confirm), so that it rarely finds a start still
	// on its way, which it would charge the whole hold.
	DefaultSpendSweep = time.Minute
	// spendSweepBatch bounds the holds one sweep looks at.
	spendSweepBatch = 100
)

// spending is the gateway's side of the callers' budgets: the ledger, the
// routes' descriptions the worst case is priced with, and the actions
// this process watches to settle.
type spending struct {
	store  callerbudget.Store
	routes map[string]attempt.RouteInfo
	c      *durallm.Client
	log    interface {
		Warn(string, ...any)
		Error(string, ...any)
	}
	now   func() time.Time
	sweep time.Duration

	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu       sync.Mutex
	watching map[string]bool
	// committed is, per caller, its period's account as this gateway
	// last saw it (the metrics' gauges).
	committed map[string]callerbudget.Account

	refusals      metric.Int64Counter
	settledTokens metric.Int64Counter
	settledCost   metric.Float64Counter
}

// newSpending sets up the callers' budgets of a gateway with a ledger,
// and starts its sweep; nil without one.
func newSpending(g *Gateway) (*spending, error) {
	o := g.o
	if o.Spend == nil {
		if o.Tokens != nil && o.Tokens.Budgets() {
			return nil, errors.New("gateway: a caller has a budget and Options.Spend is nil: give the gateway a spend ledger (--journal-dsn or --spend-file)")
		}
		return nil, nil
	}
	s := &spending{store: o.Spend, routes: o.Routes, c: o.Client, log: o.Logger, now: time.Now, sweep: o.SpendSweep,
		watching: map[string]bool{}, committed: map[string]callerbudget.Account{}}
	if s.sweep <= 0 {
		s.sweep = DefaultSpendSweep
	}
	if err := s.instruments(o.Meter); err != nil {
		return nil, err
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.sweepEvery()
	return s, nil
}

// Close stops the gateway's own work in the background: the watches
// that settle its callers' holds and the sweep. A hold whose action
// still runs stays in the ledger, and the sweep of any gateway sharing
// it (this one, restarted) settles it once the action ends.
func (g *Gateway) Close() {
	if g.spend == nil {
		return
	}
	g.spend.stop()
	g.spend.wg.Wait()
}

func (s *spending) instruments(m metric.Meter) error {
	if m == nil {
		return nil
	}
	var err error
	if s.refusals, err = m.Int64Counter("durallm.gateway.caller_budget.refusals",
		metric.WithDescription("Requests refused before any start because the caller's budget could not hold their worst case")); err != nil {
		return err
	}
	if s.settledTokens, err = m.Int64Counter("durallm.gateway.caller_budget.settled_tokens",
		metric.WithDescription("Tokens charged to callers' budgets as their actions ended")); err != nil {
		return err
	}
	if s.settledCost, err = m.Float64Counter("durallm.gateway.caller_budget.settled_cost",
		metric.WithDescription("Cost charged to callers' budgets as their actions ended, at the routes' prices")); err != nil {
		return err
	}
	tokens, err := m.Int64ObservableGauge("durallm.gateway.caller_budget.committed_tokens",
		metric.WithDescription("Tokens the caller's current period has committed (settled plus held), as this gateway last saw it"))
	if err != nil {
		return err
	}
	cost, err := m.Float64ObservableGauge("durallm.gateway.caller_budget.committed_cost",
		metric.WithDescription("Cost the caller's current period has committed (settled plus held), as this gateway last saw it"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		for caller, a := range s.committed {
			at := metric.WithAttributes(attribute.String("durallm.caller", caller))
			c := a.Committed()
			o.ObserveInt64(tokens, c.Tokens, at)
			o.ObserveFloat64(cost, c.Cost, at)
		}
		return nil
	}, tokens, cost)
	return err
}

// seen remembers a caller's account in its current period.
func (s *spending) seen(caller Caller, period string, a callerbudget.Account) {
	if key, _ := caller.Budget.Period.Of(s.now()); key != period {
		return
	}
	s.mu.Lock()
	s.committed[caller.ID] = a
	s.mu.Unlock()
}

// startWithinBudget starts the action (startOrAttach) within the
// caller's budget: its part reserved first, and settled when it ends.
// A caller without a budget starts as it is.
func (g *Gateway) startWithinBudget(ctx context.Context, caller Caller, id string, in workflows.ActionInput, memo gatewayMemo, m Model) (*session, *answer.Problem) {
	if caller.Budget == nil {
		return g.startOrAttach(ctx, id, in, memo, m)
	}
	s := g.spend
	if s == nil {
		// A tokens file reloaded with a budget on a gateway started
		// without a ledger: never served unbounded.
		g.log.Error("gateway: a caller has a budget and this gateway keeps no spend ledger; restart it with --journal-dsn or --spend-file", "caller", caller.ID)
		return nil, &answer.Problem{Kind: answer.Internal, Message: "your budget cannot be kept by this gateway (it has no spend ledger); nothing was started"}
	}
	r, p := s.reserve(ctx, caller, m, id, &in)
	if p != nil {
		if p.Kind == answer.SpendExhausted && memo.Keyed {
			// A keyed resend of an action that exists costs nothing
			// more: its replay, or the running action, whatever the
			// budget has left.
			if _, err := g.c.Describe(ctx, id); err == nil {
				return g.find(ctx, id, memo, m)
			}
		}
		return nil, p
	}
	sess, p := g.startOrAttach(ctx, id, in, memo, m)
	switch {
	case r.Existing:
		// The hold of the action the key names: whoever started it
		// watches it, or a sweep finds it.
	case p != nil && p.Kind == answer.MaybeStarted, p == nil && !sess.found:
		s.watch(id, r.Held)
	default:
		// Nothing was started for this hold: refused, or the key found
		// an action that holds nothing of it.
		s.settle(id, workflows.Spend{})
	}
	return sess, p
}

// reserve takes the request's part of the caller's budget and sets it as
// the action's budget, or says why the request cannot start.
func (s *spending) reserve(ctx context.Context, caller Caller, m Model, id string, in *workflows.ActionInput) (callerbudget.Reservation, *answer.Problem) {
	lim := caller.Budget
	least, p := s.worstCase(in.Request, m, lim.Budget.Cost > 0)
	if p != nil {
		return callerbudget.Reservation{}, p
	}
	// Room for every attempt the action may make, while the limit leaves
	// it; at least one.
	n := in.WithDefaults(id).MaxAttempts
	want := workflows.Spend{Tokens: least.Tokens * int64(n), Cost: least.Cost * float64(n)}
	period, end := lim.Period.Of(s.now())
	r, err := s.store.Reserve(ctx, callerbudget.Ask{ActionID: id, Caller: caller.ID, Period: period, Limit: lim.Budget, Least: least, Want: want})
	if err != nil {
		s.log.Error("gateway: the spend ledger failed; the request was refused", "caller", caller.ID, "error", err)
		return r, &answer.Problem{Kind: answer.Internal, Message: "the gateway could not read your budget's ledger; nothing was started"}
	}
	s.seen(caller, period, r.Account)
	if !r.OK {
		if s.refusals != nil {
			kind := "tokens"
			if r.Short == workflows.WhyCostBudget {
				kind = "cost"
			}
			s.refusals.Add(context.Background(), 1, metric.WithAttributes(attribute.String("durallm.caller", caller.ID), attribute.String("durallm.limit", kind)))
		}
		return r, overBudget(lim, r, least, end)
	}
	b := workflows.Budget{Tokens: r.Held.Tokens, Cost: r.Held.Cost}
	if lim.Budget.Cost > 0 && b.Cost == 0 {
		// Every route the action may use costs nothing (prices of zero):
		// its cost cannot pass what is left, and a positive cost budget
		// still keeps it off routes without prices.
		b.Cost = r.Account.Left(lim.Budget).Cost
		if b.Cost == 0 {
			b.Cost = lim.Budget.Cost
		}
	}
	in.Budget = &b
	return r, nil
}

// worstCase is one attempt's worst case on the dearest of the model's
// routes (workflows.WorstCase, what the action's budget reserves before
// each attempt). A route this gateway has no description of counts as an
// openai route without prices (the larger default output bound); under
// a cost limit, routes without prices are left out, as the action skips
// them.
func (s *spending) worstCase(r providers.Request, m Model, priced bool) (workflows.Spend, *answer.Problem) {
	var w workflows.Spend
	found := false
	for _, name := range m.Routes {
		info, ok := s.routes[name]
		if !ok {
			info = attempt.RouteInfo{Name: name}
		}
		if priced && info.Prices == nil {
			continue
		}
		c, ok := workflows.WorstCase(r, info)
		if !ok {
			return w, badRequest("messages", "the request has a file content part, whose tokens nothing bounds, so your budget cannot reserve its worst case; nothing was started")
		}
		w.Tokens, w.Cost = max(w.Tokens, c.Tokens), max(w.Cost, c.Cost)
		found = true
	}
	if !found {
		return w, badRequest("model", "your budget limits cost, and no route of model "+m.Name+" has prices this gateway knows of (its --routes file); nothing was started")
	}
	return w, nil
}

// overBudget is the answer to a request the caller's budget cannot hold:
// the action's own spend_exhausted answer (OpenAI's 429
// insufficient_quota, Anthropic's 402 billing_error), which no client
// resends by itself. It says the numbers, never content.
func overBudget(lim *callerbudget.Limit, r callerbudget.Reservation, least workflows.Spend, end time.Time) *answer.Problem {
	c := r.Account.Committed()
	var msg string
	if r.Short == workflows.WhyCostBudget {
		msg = fmt.Sprintf("your budget of cost %.6g per %s is spent: %.6g committed (ended requests plus the worst case of those running), and this request's worst case is %.6g",
			lim.Budget.Cost, lim.Period, c.Cost, least.Cost)
	} else {
		msg = fmt.Sprintf("your budget of %d tokens per %s is spent: %d committed (ended requests plus the worst case of those running), and this request's worst case is %d tokens (its prompt plus max_tokens)",
			lim.Budget.Tokens, lim.Period, c.Tokens, least.Tokens)
	}
	return &answer.Problem{Kind: answer.SpendExhausted,
		Message: msg + "; nothing was started. The period ends at " + end.Format(time.RFC3339) + ", or a smaller request (a lower max_tokens) may fit"}
}

// watch settles the action's hold once it ends, from its result; a
// gateway that closes first leaves it to a sweep.
func (s *spending) watch(id string, held workflows.Spend) {
	s.mu.Lock()
	s.watching[id] = true
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.watching, id)
			s.mu.Unlock()
		}()
		wait := time.Second
		for {
			res, err := s.c.Get(id).Result(s.ctx)
			if charged, ended := chargeOf(res, err, held); ended {
				s.settle(id, charged)
				return
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 30*time.Second)
		}
	}()
}

// chargeOf is what an ended action is charged against its caller's
// budget, from what reading its result gave: what it committed (its
// ledger's settled and held spending); nothing for an action refused as
// invalid input; the whole hold when nothing says (Temporal keeps no
// such action, or its workflow closed without a result): never less
// than it may have spent. ended is false while it runs or its result
// cannot be read.
func chargeOf(res workflows.ActionResult, err error, held workflows.Spend) (charged workflows.Spend, ended bool) {
	switch {
	case errors.Is(err, durallm.ErrInvalidInput):
		return workflows.Spend{}, true
	case res.State != "":
		return res.Status.Committed(), true
	case errors.Is(err, durallm.ErrNotFound), errors.As(err, new(*temporal.WorkflowExecutionError)):
		return held, true
	}
	return workflows.Spend{}, false
}

// settle charges the action's hold; a hold settled already changes
// nothing.
func (s *spending) settle(id string, charged workflows.Spend) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 10*time.Second)
	defer cancel()
	h, ok, err := s.store.Settle(ctx, id, charged)
	if err != nil {
		s.log.Warn("gateway: a hold was not settled; a sweep settles it later", "action_id", id, "error", err)
		return
	}
	if !ok {
		return
	}
	attrs := metric.WithAttributes(attribute.String("durallm.caller", h.Caller))
	if s.settledTokens != nil {
		s.settledTokens.Add(context.Background(), charged.Tokens, attrs)
		s.settledCost.Add(context.Background(), charged.Cost, attrs)
	}
	if a, err := s.store.Account(ctx, h.Caller, h.Period); err == nil {
		s.mu.Lock()
		if _, known := s.committed[h.Caller]; known {
			s.committed[h.Caller] = a
		}
		s.mu.Unlock()
	}
}

// sweepEvery settles, every s.sweep, the holds that no watch of this
// process settles and whose actions ended: those a gateway that stopped
// left.
func (s *spending) sweepEvery() {
	defer s.wg.Done()
	t := time.NewTicker(s.sweep)
	defer t.Stop()
	for {
		s.sweepOnce()
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *spending) sweepOnce() {
	holds, err := s.store.Holds(s.ctx, s.now().Add(-2*s.sweep), spendSweepBatch)
	if err != nil {
		if s.ctx.Err() == nil {
			s.log.Warn("gateway: the spend ledger's holds could not be read", "error", err)
		}
		return
	}
	for _, h := range holds {
		s.mu.Lock()
		mine := s.watching[h.ActionID]
		s.mu.Unlock()
		if mine || s.ctx.Err() != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		d, err := s.c.Describe(ctx, h.ActionID)
		var res workflows.ActionResult
		switch {
		case err == nil && d.Running:
			cancel()
			continue
		case err == nil:
			res, err = s.c.Get(h.ActionID).Result(ctx)
		}
		cancel()
		if charged, ended := chargeOf(res, err, h.Spend); ended {
			s.settle(h.ActionID, charged)
		}
	}
}
