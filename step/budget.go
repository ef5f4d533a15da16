package step

import (
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/workflows"
)

// Budget is one budget, in tokens and/or cost, that the calls a workflow
// makes with WithBudget share: an agent's whole conversation, a
// pipeline's documents. Each call reserves its part before it starts and
// runs as an action whose own Budget is that reservation, so that it
// never commits more; when its action ends, the budget is charged what
// the action committed (its ledger's settled and held spending) and the
// rest of the reservation is free again. What the calls commit together
// never passes Limit: a call is held at the most it may spend for as
// long as it runs, whatever its caller does meanwhile, and one that
// cannot have any of a kind Limit bounds is not started.
//
// A Budget is a plain value that the workflow owns and keeps in its
// state, deterministic and JSON-encodable: carry it in the input of the
// next run across Continue-As-New, calls still running included, and
// pass the same pointer to every call of a run. The first call a run
// makes under it brings it up to date when it must (one activity,
// workflows.BudgetCalls): with the calls an earlier run left running,
// charged if they ended since and followed to their end if not; and on a
// run that retries a failed one (a RetryPolicy), with the calls the
// failed runs made under it, which their histories name (the
// workflows.BudgetMemo of each), so that nothing a failed run spent is
// lost and nothing is counted twice. A call is counted once by its name
// however many runs make it. docs/workflow.md, "A budget across calls",
// has the rules and an agent that uses one.
//
// Use a Budget from the workflow that owns it only; it is not safe for
// use outside workflow code.
type Budget struct {
	// Limit bounds what all the calls under the budget commit together,
	// in tokens and/or cost, as an action's Budget does its attempts.
	// Required: a Budget with neither is an invalid input to every call.
	Limit workflows.Budget `json:"limit"`
	// PerCall caps what one call reserves, per kind. A zero field caps
	// nothing of its kind: a call reserves all that is left, which suits
	// calls made one after another. Calls made in parallel, or left to
	// their verdict with ReturnIfAwaiting, hold their reservation while
	// they run: give them a cap so that they leave room for the next.
	PerCall workflows.Budget `json:"per_call,omitzero"`
	// Name tells this budget's calls from those of another Budget of the
	// same workflow, when a retried run looks for what a failed run spent.
	// Default empty.
	Name string `json:"name,omitempty"`
	// Calls are the calls counted, in the order they were made: what
	// each reserved and, once its action ended, what it was charged.
	Calls []BudgetCall `json:"calls,omitempty"`

	// synced: this run has brought the budget up to date (a new run
	// decodes a Budget without it); syncing: a call is bringing it.
	synced, syncing bool
}

// BudgetCall is one call a Budget counts.
type BudgetCall struct {
	// Name is the call's name; empty for one a retried run learned of
	// by its action id alone.
	Name     string `json:"name,omitempty"`
	ActionID string `json:"action_id"`
	// Reserved is what the call reserved: its action's Budget.
	Reserved workflows.Spend `json:"reserved"`
	// Charged is what its action committed, once it ended; nil while it
	// runs, when the call holds Reserved.
	Charged *workflows.Spend `json:"charged,omitempty"`
	// TaskQueue is the durallm task queue the call was made on, when not
	// durallm.DefaultTaskQueue: a later run follows it there.
	TaskQueue string `json:"task_queue,omitempty"`
}

// WithBudget makes a call (Call, StartCall) reserve its part of b before
// it starts and settle into b when it ends (see Budget). The call's
// action gets that part as its Budget: all that b has left, capped by
// b.PerCall and by the call's own ActionInput.Budget where they set a
// kind. When a kind b.Limit bounds has nothing left, nothing is started,
// and the call's error is an *durallm.ActionError in spend_exhausted
// (reason token_budget_exhausted or cost_budget_exhausted) whose result
// has no attempts and a note. A call whose action's first attempt does
// not fit what it reserved ends spend_exhausted itself, nothing sent.
// Either way the call is where the budget stops.
//
// Pass the same b to every call of a run; b must outlive them (keep it
// in the workflow's state). A nil b is no budget, as without the
// option, so a workflow whose input may carry one passes it as it is.
// Attach ignores it: watching an action spends nothing.
func WithBudget(b *Budget) Option {
	return func(o *options) { o.budget = b }
}

// Ledger is the budget's accounts as a workflows.Ledger: Limit, what the
// ended calls were charged (Settled), and what the calls still running
// hold (Holds, by action id), in the order the calls were made.
func (b *Budget) Ledger() workflows.Ledger {
	l := workflows.Ledger{Limit: b.Limit}
	for _, c := range b.Calls {
		if c.Charged != nil {
			l.Settled = l.Settled.Add(*c.Charged)
		} else {
			l.Holds = append(l.Holds, workflows.Hold{ID: c.ActionID, Spend: c.Reserved})
		}
	}
	return l
}

// Left is what Limit leaves after what the calls committed (charged
// plus held); zero for a kind Limit does not bound.
func (b *Budget) Left() workflows.Spend { return b.Ledger().Left() }

// Holding is how many calls hold a reservation: calls running, and
// calls a run before this one left running that the budget has not yet
// learned the end of. Once the budget is up to date in this run (its
// first call, or Sync), workflow.Await(ctx, func() bool { return
// b.Holding() == 0 }) waits until every call has settled.
func (b *Budget) Holding() int {
	n := 0
	for _, c := range b.Calls {
		if c.Charged == nil {
			n++
		}
	}
	return n
}

// Sync brings the budget up to date in this run, as the first call a run
// makes under it does by itself: it learns where the calls an earlier
// run left running stand, and on a retried run which calls the runs it
// retries made under it (one activity, workflows.BudgetCalls, on the
// durallm task queue: the TaskQueue option; other options are ignored),
// charges those that ended and follows those running to their end. It
// asks nothing when there is nothing to learn, and once a run. Use it
// before reading Left or waiting on Holding in a run that makes no call
// first.
func (b *Budget) Sync(ctx workflow.Context, opts ...Option) error {
	if errs := b.problems(); len(errs) > 0 {
		return &workflows.InputError{Problems: errs}
	}
	return b.bringUpToDate(ctx, newOptions(opts))
}

// problems lists what is wrong with the budget itself.
func (b *Budget) problems() []error {
	errs := b.Limit.Problems("step budget.limit")
	if b.PerCall != (workflows.Budget{}) {
		errs = append(errs, b.PerCall.Problems("step budget.per_call")...)
	}
	return errs
}

// reserve reserves the call's part of the budget, or finds the call
// among those it counts already (a call made again by name, by this run
// or an earlier one), and returns in with the action's Budget. Nothing
// is reserved when it returns an error.
func (b *Budget) reserve(ctx workflow.Context, f *Future, name string, in workflows.ActionInput) (workflows.ActionInput, error) {
	if errs := b.problems(); len(errs) > 0 {
		return in, &workflows.InputError{Problems: errs}
	}
	if err := b.bringUpToDate(ctx, f.o); err != nil {
		return in, err
	}
	if i := b.find(name, f.id); i >= 0 {
		// Counted already: its action exists, and the start reaches it.
		c := &b.Calls[i]
		if c.Name == "" {
			c.Name = name
		}
		if r := (workflows.Budget{Tokens: c.Reserved.Tokens, Cost: c.Reserved.Cost}); len(r.Problems("")) == 0 {
			in.Budget = &r
		}
		f.budget, f.entry = b, i
		return in, nil
	}
	l := b.Ledger()
	r, ok, why := reservation(l, b.PerCall, in.Budget)
	if !ok {
		return in, refusal(ctx, f.id, why, l)
	}
	in.Budget = &r
	// A budget reaches the action's input: what it makes invalid (a
	// file content part, which nothing bounds) is the caller's to know.
	if err := in.WithDefaults(f.id).Validate(); err != nil {
		return in, err
	}
	c := BudgetCall{Name: name, ActionID: f.id, Reserved: workflows.Spend{Tokens: r.Tokens, Cost: r.Cost}}
	if f.o.taskQueue != durallm.DefaultTaskQueue {
		c.TaskQueue = f.o.taskQueue
	}
	b.Calls = append(b.Calls, c)
	f.budget, f.entry = b, len(b.Calls)-1
	return in, nil
}

// reservation is what a call reserves from l: per kind l bounds, what
// is left, capped by perCall and by the call's own budget (own; nil for
// none) where they set that kind; per kind l does not bound, the call's
// own limit. ok is false when a kind l bounds has nothing left; why
// then names it (workflows.WhyTokenBudget, WhyCostBudget).
func reservation(l workflows.Ledger, perCall workflows.Budget, own *workflows.Budget) (r workflows.Budget, ok bool, why string) {
	if own != nil {
		r = *own
	}
	left := l.Left()
	if l.Limit.Tokens > 0 {
		r.Tokens = capped(left.Tokens, perCall.Tokens, r.Tokens)
		if r.Tokens <= 0 {
			return r, false, workflows.WhyTokenBudget
		}
	}
	if l.Limit.Cost > 0 {
		r.Cost = capped(left.Cost, perCall.Cost, r.Cost)
		if r.Cost <= 0 {
			return r, false, workflows.WhyCostBudget
		}
	}
	return r, true, ""
}

// capped is v lowered to each cap that is set (above zero).
func capped[T int64 | float64](v T, caps ...T) T {
	for _, c := range caps {
		if c > 0 {
			v = min(v, c)
		}
	}
	return v
}

// refusal is the error of a call the budget had nothing left for: an
// ActionError in spend_exhausted, for an action that was never started.
func refusal(ctx workflow.Context, id, why string, l workflows.Ledger) error {
	c := l.Committed()
	kind, limit, committed := "token", fmt.Sprint(l.Limit.Tokens), fmt.Sprint(c.Tokens)
	if why == workflows.WhyCostBudget {
		kind, limit, committed = "cost", fmt.Sprintf("%.6g", l.Limit.Cost), fmt.Sprintf("%.6g", c.Cost)
	}
	note := fmt.Sprintf("not started: the parent's budget has nothing left of its %s limit (%s of %s committed, %d calls holding)", kind, committed, limit, len(l.Holds))
	res := workflows.ActionResult{Status: workflows.Status{
		ActionRef: id, State: workflows.StateSpendExhausted, Outcome: why, Reason: why,
		Notes: []workflows.Note{{At: workflow.Now(ctx), What: note}},
	}}
	return durallm.ResultError(res, nil)
}

// find is the index of the call counted under name, or under the action
// id, or -1.
func (b *Budget) find(name, id string) int {
	for i, c := range b.Calls {
		if name != "" && c.Name == name {
			return i
		}
	}
	for i, c := range b.Calls {
		if c.ActionID == id {
			return i
		}
	}
	return -1
}

// settle charges call i what its action committed, once: a call
// followed twice (a run's own call, and the follow of a call an earlier
// run left running) is charged by whichever end comes first, the same.
func (b *Budget) settle(i int, s workflows.Spend) {
	if c := &b.Calls[i]; c.Charged == nil {
		c.Charged = &s
	}
}

// bringUpToDate learns, once a run, where the calls that the budget
// holds for an earlier run stand, and on a retried run which calls the
// runs it retries made under it (workflows.BudgetCalls): one that ended
// is charged what it committed (or, closed without a result or no longer
// kept by Temporal, what it reserved); one still running is held at the
// most it may commit and followed to its end. A run that carries no
// hold and retries nothing asks nothing.
func (b *Budget) bringUpToDate(ctx workflow.Context, o options) error {
	if b.syncing {
		// Calls started at once at a run's start: one asks, the others
		// wait for its answer.
		if err := workflow.Await(ctx, func() bool { return !b.syncing }); err != nil {
			return err
		}
	}
	if b.synced {
		return nil
	}
	info := workflow.GetInfo(ctx)
	q := workflows.BudgetQuery{ParentID: info.WorkflowExecution.ID, Budget: b.Name}
	for _, c := range b.Calls {
		if c.Charged == nil {
			q.Held = append(q.Held, c.ActionID)
		}
	}
	if info.Attempt > 1 && info.ContinuedExecutionRunID != "" {
		q.Retried = info.ContinuedExecutionRunID
		for _, c := range b.Calls {
			q.Known = append(q.Known, c.ActionID)
		}
	}
	if len(q.Held) > 0 || q.Retried != "" {
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			TaskQueue:           o.taskQueue,
			StartToCloseTimeout: time.Minute,
			// Until a durallm worker answers, as a call waits for one.
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: 30 * time.Second},
			Summary:     "bring the budget up to date",
		})
		var spent []workflows.CallSpend
		b.syncing = true
		err := workflow.ExecuteActivity(actx, workflows.BudgetCalls, q).Get(actx, &spent)
		b.syncing = false
		if err != nil {
			return fmt.Errorf("step: bring the budget up to date: %w", err)
		}
		for _, s := range spent {
			b.learn(ctx, s, o)
		}
	}
	b.synced = true
	return nil
}

// learn takes in where a call of an earlier run stands.
func (b *Budget) learn(ctx workflow.Context, s workflows.CallSpend, o options) {
	i := b.find("", s.ActionRef)
	if i < 0 {
		// A call a failed run made, which this run's budget did not have.
		c := BudgetCall{ActionID: s.ActionRef}
		parent := workflow.GetInfo(ctx).WorkflowExecution.ID
		if name, ok := strings.CutPrefix(s.ActionRef, parent+"-"); ok && ActionID(parent, name) == s.ActionRef {
			c.Name = name
		}
		if o.taskQueue != durallm.DefaultTaskQueue {
			c.TaskQueue = o.taskQueue
		}
		b.Calls = append(b.Calls, c)
		i = len(b.Calls) - 1
	}
	c := &b.Calls[i]
	if c.Charged != nil {
		return
	}
	if s.Limit != nil {
		c.Reserved = maxSpend(c.Reserved, workflows.Spend{Tokens: s.Limit.Tokens, Cost: s.Limit.Cost})
	}
	if s.Committed != nil && s.Limit == nil {
		c.Reserved = maxSpend(c.Reserved, *s.Committed)
	}
	switch {
	case s.Found && s.Ended && s.Committed != nil:
		b.settle(i, *s.Committed)
	case !s.Found || s.Ended:
		b.settle(i, c.Reserved)
	default:
		b.follow(ctx, i, s.RunID)
	}
}

// follow follows call i, which an earlier run started, to its end and
// settles it then, as Attach would watch it (through
// workflows.AwaitCall).
func (b *Budget) follow(ctx workflow.Context, i int, runID string) {
	c := b.Calls[i]
	o := options{taskQueue: durallm.DefaultTaskQueue}
	if c.TaskQueue != "" {
		o.taskQueue = c.TaskQueue
	}
	// Not the call's context, which its caller may cancel alone.
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	f := newFuture(dctx, c.ActionID, o, false)
	f.budget, f.entry = b, i
	f.markStarted(workflow.Execution{ID: c.ActionID, RunID: runID}, nil)
	workflow.Go(f.dctx, func(ctx workflow.Context) {
		f.followExisting(ctx, workflows.CallPosition{Found: true, RunID: runID})
	})
}

// maxSpend is the larger of a and b, per kind.
func maxSpend(a, b workflows.Spend) workflows.Spend {
	return workflows.Spend{Tokens: max(a.Tokens, b.Tokens), Cost: max(a.Cost, b.Cost)}
}
