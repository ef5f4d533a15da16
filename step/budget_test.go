package step_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/actiontest"
	"github.com/durallm/durallm/workflows"
)

// A parent's budget across its calls, in virtual time: the calls are the
// real LLMAction with scripted attempts, each reporting its usage as a
// provider would.

// budgetAsk is one turn's request: a short prompt, at most 100 tokens
// out.
func budgetAsk() workflows.ActionInput {
	in := ask("what next?")
	in.Request.Params = map[string]json.RawMessage{"max_tokens": json.RawMessage("100")}
	return in
}

// worstOf is the worst case of one attempt of budgetAsk: its prompt's
// bound plus its 100 tokens out.
func worstOf(t *testing.T) (prompt, worst int64) {
	t.Helper()
	p, ok := budgetAsk().Request.PromptTokenBound(0)
	if !ok {
		t.Fatal("no prompt bound")
	}
	return int64(p), int64(p) + 100
}

// used is an answer that used 20 prompt and 100 completion tokens.
const used = 120

func answered(text string) actiontest.Attempt {
	return actiontest.Respond(providers.Response{Text: text, FinishReason: "stop",
		Usage: providers.Usage{PromptTokens: 20, CompletionTokens: 100, TotalTokens: used}})
}

// agentIn is budgetAgent's input: its budget, how many turns it may
// take, and with Patience, how long it waits for a call awaiting a
// verdict before it goes on to the next turn.
type agentIn struct {
	Budget   step.Budget   `json:"budget"`
	Turns    int           `json:"turns"`
	Patience time.Duration `json:"patience,omitempty"`
	// ContinueAfter makes the run continue as new after that many turns.
	ContinueAfter int `json:"continue_after,omitempty"`
}

// agentOut is what budgetAgent reports once every call it made has
// settled.
type agentOut struct {
	// Stopped is the turn the budget stopped at (0: none), and how.
	Stopped      int             `json:"stopped"`
	StopState    workflows.State `json:"stop_state,omitempty"`
	StopReason   string          `json:"stop_reason,omitempty"`
	StopAttempts int             `json:"stop_attempts"`
	// Early are the turns that returned early, awaiting a verdict.
	Early []int `json:"early,omitempty"`
	// MostCommitted is the most the budget had committed after any turn.
	MostCommitted workflows.Spend `json:"most_committed"`
	Budget        step.Budget     `json:"budget"`
}

// budgetAgent is a looping agent under a parent budget: one call a
// turn, each named after its turn, until the budget stops it.
func budgetAgent(ctx workflow.Context, in agentIn) (agentOut, error) {
	b := &in.Budget
	var out agentOut
	for turn := 1; turn <= in.Turns; turn++ {
		if in.ContinueAfter > 0 && turn > in.ContinueAfter {
			in.Turns, in.ContinueAfter = in.Turns-in.ContinueAfter, 0
			return out, workflow.NewContinueAsNewError(ctx, budgetAgent, in)
		}
		opts := []step.Option{step.WithBudget(b)}
		if in.Patience > 0 {
			opts = append(opts, step.ReturnIfAwaiting(in.Patience))
		}
		res, err := step.Call(ctx, fmt.Sprintf("turn-%d", turn), budgetAsk(), opts...)
		if c := b.Ledger().Committed(); c.Tokens > out.MostCommitted.Tokens {
			out.MostCommitted = c
		}
		var ae *durallm.ActionError
		switch {
		case errors.As(err, &ae) && ae.State == workflows.StateSpendExhausted:
			out.Stopped, out.StopState, out.StopReason, out.StopAttempts = turn, ae.State, ae.Reason, len(ae.Result.Attempts)
		case errors.Is(err, durallm.ErrAwaitingReconciliation):
			out.Early = append(out.Early, turn)
			continue
		case err != nil:
			return out, err
		case res.Response == nil:
			return out, fmt.Errorf("turn %d: no response", turn)
		default:
			continue
		}
		break
	}
	if err := workflow.Await(ctx, func() bool { return b.Holding() == 0 }); err != nil {
		return out, err
	}
	out.Budget = *b
	return out, nil
}

func runAgent(t *testing.T, in agentIn, script func(*actiontest.Actions)) (agentOut, *actiontest.Actions, *testsuite.TestWorkflowEnvironment) {
	t.Helper()
	env, actions := newEnv(t)
	script(actions)
	return resultOf[agentOut](t, env, actions, budgetAgent, in), actions, env
}

// resultOf runs wf in env and returns its result, failing the test when
// it failed or left a scripted attempt unrun.
func resultOf[T any](t *testing.T, env *testsuite.TestWorkflowEnvironment, actions *actiontest.Actions, wf any, args ...any) T {
	t.Helper()
	env.ExecuteWorkflow(wf, args...)
	if !env.IsWorkflowCompleted() {
		t.Fatal("the workflow did not complete")
	}
	if err := env.GetWorkflowError(); err != nil {
		t.Fatalf("the workflow failed: %v", err)
	}
	var out T
	if err := env.GetWorkflowResult(&out); err != nil {
		t.Fatal(err)
	}
	actions.AssertExpectations(t)
	return out
}

// A 10-turn agent under a parent budget whose third
// call is ambiguous, returns early and gets its verdict only half an hour
// later, after the agent has gone on. The agent stops at the call that
// would overshoot, the eighth: that call's action sends nothing, and the
// two after it are never made. The third call's reservation was held
// for it all along, so what the calls committed never passed the budget
// at any turn; its verdict (not_executed) let it try again within what
// it held, and the budget was charged what it then used. Without that
// hold (hindsight) the eighth call would have been sent.
func TestATenCallAgentUnderAParentBudgetStopsAtTheCallThatWouldOvershoot(t *testing.T) {
	prompt, worst := worstOf(t)
	// Two worst cases per call, so that a call awaiting its verdict can
	// try again after it; the limit leaves the eighth call less than its
	// least attempt (its prompt and 16 tokens out) once the third holds
	// its two worst cases and six calls have used theirs.
	limit := 6*used + 2*worst + prompt + workflows.MinMaxTokens - 1
	in := agentIn{Budget: step.Budget{Limit: workflows.Budget{Tokens: limit}, PerCall: workflows.Budget{Tokens: 2 * worst}}, Turns: 10, Patience: time.Minute}
	out, actions, env := runAgent(t, in, func(a *actiontest.Actions) {
		for turn := 1; turn <= 7; turn++ {
			if turn == 3 {
				a.On("turn-3", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 30*time.Minute), answered("three, after the verdict"))
				continue
			}
			a.On(fmt.Sprintf("turn-%d", turn), answered(fmt.Sprint(turn)))
		}
	})
	if out.Stopped != 8 || out.StopState != workflows.StateSpendExhausted || out.StopReason != workflows.WhyTokenBudget || out.StopAttempts != 0 {
		t.Fatalf("stopped at turn %d (%s %s, %d attempts), want turn 8 with nothing sent", out.Stopped, out.StopState, out.StopReason, out.StopAttempts)
	}
	if len(out.Early) != 1 || out.Early[0] != 3 {
		t.Fatalf("early returns %v, want turn 3's", out.Early)
	}
	if n := len(actions.Sent("turn-8")); n != 0 {
		t.Fatalf("turn 8 sent %d attempts", n)
	}
	if out.MostCommitted.Tokens > limit {
		t.Fatalf("committed %d tokens at one turn, over the budget's %d", out.MostCommitted.Tokens, limit)
	}
	l := out.Budget.Ledger()
	if l.Settled.Tokens != 7*used || len(l.Holds) != 0 || l.Committed().Tokens > limit {
		t.Fatalf("ledger %+v, want the 7 answers' %d tokens settled", l, 7*used)
	}
	if len(out.Budget.Calls) != 8 {
		t.Fatalf("%d calls counted, want 8", len(out.Budget.Calls))
	}
	// Each call's action had what the budget reserved for it as its own
	// budget, and the budget was charged what the action committed.
	for i, c := range out.Budget.Calls {
		turn := i + 1
		st := statusOf(t, env, step.ActionID(parentID, c.Name))
		if c.Name != fmt.Sprintf("turn-%d", turn) || st.Ledger == nil || st.Ledger.Limit.Tokens != c.Reserved.Tokens || c.Charged == nil || *c.Charged != st.Ledger.Committed() {
			t.Fatalf("call %d %+v; its action's ledger %+v", turn, c, st.Ledger)
		}
	}
	if c := out.Budget.Calls[2]; c.Reserved.Tokens != 2*worst || c.Charged.Tokens != used {
		t.Fatalf("turn 3 reserved %d and was charged %d, want %d and %d", c.Reserved.Tokens, c.Charged.Tokens, 2*worst, used)
	}
	// In hindsight, without the third call's hold, the eighth would have
	// had room for an attempt.
	if hindsight := limit - 6*used; hindsight < prompt+workflows.MinMaxTokens {
		t.Fatalf("the case does not show the hold: %d left in hindsight", hindsight)
	}
}

// parallelOut is what parallelCalls reports.
type parallelOut struct {
	Reserved []int64 `json:"reserved"`
	// Refused is the error of the call the budget had nothing left for,
	// and StartErr what its Started said.
	Refused  outcome     `json:"refused"`
	StartErr string      `json:"start_err"`
	Note     string      `json:"note"`
	Texts    []string    `json:"texts"`
	After    outcome     `json:"after"`
	Budget   step.Budget `json:"budget"`
}

// parallelCalls starts three calls at once under a budget that caps
// each, then a fourth, then waits for the three and makes a fifth.
func parallelCalls(ctx workflow.Context, b step.Budget) (parallelOut, error) {
	var out parallelOut
	start := workflow.Now(ctx)
	var fs []*step.Future
	for _, name := range []string{"a", "b", "c"} {
		fs = append(fs, step.StartCall(ctx, name, budgetAsk(), step.WithBudget(&b)))
	}
	for _, c := range b.Calls {
		out.Reserved = append(out.Reserved, c.Reserved.Tokens)
	}
	refused := step.StartCall(ctx, "d", budgetAsk(), step.WithBudget(&b))
	res, err := refused.Get(ctx)
	out.Refused = describe(ctx, start, refused.ActionID(), res, err)
	if err := refused.Started().Get(ctx, nil); err != nil {
		out.StartErr = err.Error()
	}
	var ae *durallm.ActionError
	if errors.As(err, &ae) && len(ae.Result.Notes) == 1 {
		out.Note = ae.Result.Notes[0].What
	}
	for _, f := range fs {
		res, err := f.Get(ctx)
		if err != nil {
			return out, err
		}
		out.Texts = append(out.Texts, res.Response.Text)
	}
	res, err = step.Call(ctx, "e", budgetAsk(), step.WithBudget(&b))
	out.After = describe(ctx, start, "e", res, err)
	out.Budget = b
	return out, nil
}

// Calls started at once each reserve their part, capped by PerCall, so
// that they run side by side; a call the budget has nothing left for is
// not started (an ActionError in spend_exhausted, with a note, and
// Started says so too), and once the others have settled there is room
// again.
func TestCallsInParallelEachReserveTheirCapAndOneWithNothingLeftStartsNothing(t *testing.T) {
	_, worst := worstOf(t)
	env, actions := newEnv(t)
	for _, name := range []string{"a", "b", "c", "e"} {
		actions.On(name, answered(name))
	}
	out := resultOf[parallelOut](t, env, actions, parallelCalls, step.Budget{Limit: workflows.Budget{Tokens: 3 * worst}, PerCall: workflows.Budget{Tokens: worst}})
	if len(out.Reserved) != 3 || out.Reserved[0] != worst || out.Reserved[1] != worst || out.Reserved[2] != worst {
		t.Fatalf("reserved %v, want %d each", out.Reserved, worst)
	}
	if r := out.Refused; !r.Action || r.State != workflows.StateSpendExhausted || r.Attempts != 0 || out.StartErr == "" || out.Note == "" {
		t.Fatalf("the fourth call: %+v, started: %q, note %q", r, out.StartErr, out.Note)
	}
	if len(actions.Sent("d")) != 0 {
		t.Fatal("the refused call sent an attempt")
	}
	if a := out.After; a.Err != "" || a.Text != "e" {
		t.Fatalf("the call after the others settled: %+v", a)
	}
	if l := out.Budget.Ledger(); l.Settled.Tokens != 4*used || len(l.Holds) != 0 || len(out.Budget.Calls) != 4 {
		t.Fatalf("ledger %+v calls %+v", l, out.Budget.Calls)
	}
}

// Without PerCall a call reserves all that is left, capped by its own
// budget when it has one; the action's budget is what it reserved.
func TestACallReservesAllThatIsLeftCappedByItsOwnBudget(t *testing.T) {
	_, worst := worstOf(t)
	env, actions := newEnv(t)
	actions.On("own", answered("own"))
	actions.On("rest", answered("rest"))
	b := resultOf[step.Budget](t, env, actions, func(ctx workflow.Context) (step.Budget, error) {
		b := step.Budget{Limit: workflows.Budget{Tokens: 10 * worst}}
		in := budgetAsk()
		in.Budget = &workflows.Budget{Tokens: 2 * worst}
		if _, err := step.Call(ctx, "own", in, step.WithBudget(&b)); err != nil {
			return b, err
		}
		_, err := step.Call(ctx, "rest", budgetAsk(), step.WithBudget(&b))
		return b, err
	})
	if len(b.Calls) != 2 || b.Calls[0].Reserved.Tokens != 2*worst || b.Calls[1].Reserved.Tokens != 10*worst-used {
		t.Fatalf("calls %+v", b.Calls)
	}
	for _, c := range b.Calls {
		if st := statusOf(t, env, step.ActionID(parentID, c.Name)); st.Ledger.Limit.Tokens != c.Reserved.Tokens {
			t.Fatalf("%s: its action's budget %+v, reserved %+v", c.Name, st.Ledger.Limit, c.Reserved)
		}
	}
}

// A cost budget: a call reserves cost, its action prices its attempts at
// its route's prices, and the budget is charged the action's cost.
func TestACostBudgetIsReservedAndChargedAtTheRoutesPrices(t *testing.T) {
	prices := providers.Prices{Input: 2, CachedInput: 1, CacheWriteInput: 2, Output: 8}
	prompt, _ := worstOf(t)
	worstCost := prices.WorstCost(prompt, 100)
	env, actions := newEnv(t)
	for _, r := range []string{"primary", "fallback"} {
		actions.Route(attempt.RouteInfo{Name: r, Kind: "openai", Model: r, Prices: &prices})
	}
	actions.On("one", answered("one"))
	actions.On("two", answered("two"))
	limit := 2*worstCost + 0.5*worstCost
	b := resultOf[step.Budget](t, env, actions, func(ctx workflow.Context) (step.Budget, error) {
		b := step.Budget{Limit: workflows.Budget{Cost: limit}}
		for _, name := range []string{"one", "two"} {
			if _, err := step.Call(ctx, name, budgetAsk(), step.WithBudget(&b)); err != nil {
				return b, err
			}
		}
		return b, nil
	})
	cost := prices.Cost(providers.Usage{PromptTokens: 20, CompletionTokens: 100, TotalTokens: used})
	if len(b.Calls) != 2 || b.Calls[0].Reserved.Cost != limit || b.Calls[0].Charged.Cost != cost || b.Calls[1].Reserved.Cost != limit-cost {
		t.Fatalf("calls %+v, want the first to reserve %v and be charged %v", b.Calls, limit, cost)
	}
	if c := b.Ledger().Committed(); c.Cost > limit || c.Tokens != 2*used {
		t.Fatalf("committed %+v", c)
	}
}

// A budget with no limit, or a negative cap, is an invalid input to the
// call: nothing is started.
func TestABudgetWithoutALimitIsAnInvalidInput(t *testing.T) {
	env, _ := newEnv(t)
	out := run(t, env, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		var out []outcome
		for i, b := range []step.Budget{{}, {Limit: workflows.Budget{Tokens: 100}, PerCall: workflows.Budget{Tokens: -1}}} {
			f := step.StartCall(ctx, fmt.Sprint("call-", i), budgetAsk(), step.WithBudget(&b))
			res, err := f.Get(ctx)
			out = append(out, describe(ctx, start, f.ActionID(), res, err))
		}
		return out, nil
	})
	for i, o := range out {
		if !o.Invalid || o.Attempts != 0 {
			t.Fatalf("budget %d: %+v", i, o)
		}
	}
}

// A run that continues as new while a call awaits its verdict carries
// the call's reservation, held, in the budget it hands the next run.
func TestContinueAsNewCarriesTheHoldOfACallAwaitingItsVerdict(t *testing.T) {
	_, worst := worstOf(t)
	env, actions := newEnv(t)
	actions.On("turn-1", answered("one"))
	actions.On("turn-2", actiontest.Ambiguous())
	env.ExecuteWorkflow(budgetAgent, agentIn{Budget: step.Budget{Limit: workflows.Budget{Tokens: 10 * worst}, PerCall: workflows.Budget{Tokens: worst}}, Turns: 5, Patience: time.Minute, ContinueAfter: 2})
	var can *workflow.ContinueAsNewError
	if err := env.GetWorkflowError(); !errors.As(err, &can) {
		t.Fatalf("the run ended with %v, want a Continue-As-New", err)
	}
	var next agentIn
	if err := converter.GetDefaultDataConverter().FromPayloads(can.Input, &next); err != nil {
		t.Fatal(err)
	}
	b := next.Budget
	if l := b.Ledger(); len(b.Calls) != 2 || l.Settled.Tokens != used || len(l.Holds) != 1 || l.Holds[0].ID != step.ActionID(parentID, "turn-2") || l.Holds[0].Spend.Tokens != worst {
		t.Fatalf("the budget handed on: %+v", b)
	}
	if next.Turns != 3 {
		t.Fatalf("next %+v", next)
	}
}

// A call made twice under the budget, the second while the first runs,
// is one call: reserved once, charged once, executed once.
func TestTheSameCallTwiceIsReservedAndChargedOnce(t *testing.T) {
	_, worst := worstOf(t)
	env, actions := newEnv(t)
	actions.On("plan", answered("the plan").Taking(time.Minute))
	actions.On("next", answered("next"))
	b := resultOf[step.Budget](t, env, actions, func(ctx workflow.Context) (step.Budget, error) {
		b := step.Budget{Limit: workflows.Budget{Tokens: 10 * worst}, PerCall: workflows.Budget{Tokens: 2 * worst}}
		first := step.StartCall(ctx, "plan", budgetAsk(), step.WithBudget(&b))
		again := step.StartCall(ctx, "plan", budgetAsk(), step.WithBudget(&b))
		for _, f := range []*step.Future{first, again} {
			if res, err := f.Get(ctx); err != nil || res.Response.Text != "the plan" {
				return b, fmt.Errorf("plan: %v", err)
			}
		}
		_, err := step.Call(ctx, "next", budgetAsk(), step.WithBudget(&b))
		return b, err
	})
	if l := b.Ledger(); len(b.Calls) != 2 || l.Settled.Tokens != 2*used || len(l.Holds) != 0 || b.Calls[1].Reserved.Tokens != 2*worst {
		t.Fatalf("calls %+v", b.Calls)
	}
	if n := len(actions.Sent("plan")); n != 1 {
		t.Fatalf("plan sent %d attempts", n)
	}
}

// A run handed a budget that holds a call whose action is gone
// (Temporal no longer keeps it; here, an environment that never ran it)
// charges that call all it reserved, the most it may have spent, at its
// first call, and reserves the next from what is left.
func TestARunHandedAHoldWhoseActionIsGoneChargesWhatItReserved(t *testing.T) {
	_, worst := worstOf(t)
	env, actions := newEnv(t)
	actions.On("turn-3", answered("three"))
	gone := step.BudgetCall{Name: "turn-2", ActionID: step.ActionID(parentID, "turn-2"), Reserved: workflows.Spend{Tokens: worst}}
	settled := step.BudgetCall{Name: "turn-1", ActionID: step.ActionID(parentID, "turn-1"), Reserved: workflows.Spend{Tokens: worst}, Charged: &workflows.Spend{Tokens: used}}
	limit := 2*worst + used
	b := resultOf[step.Budget](t, env, actions, func(ctx workflow.Context) (step.Budget, error) {
		b := step.Budget{Limit: workflows.Budget{Tokens: limit}, Calls: []step.BudgetCall{settled, gone}}
		_, err := step.Call(ctx, "turn-3", budgetAsk(), step.WithBudget(&b))
		return b, err
	})
	if len(b.Calls) != 3 || b.Calls[1].Charged == nil || b.Calls[1].Charged.Tokens != worst || b.Calls[2].Reserved.Tokens != limit-used-worst || b.Calls[2].Charged.Tokens != used {
		t.Fatalf("calls %+v", b.Calls)
	}
}

// WithBudget(nil) is no budget: the call runs as without the option.
func TestANilBudgetIsNoBudget(t *testing.T) {
	env, actions := newEnv(t)
	actions.On("ask", answered("free"))
	out := resultOf[[]outcome](t, env, actions, func(ctx workflow.Context) ([]outcome, error) {
		start := workflow.Now(ctx)
		var none *step.Budget
		res, err := step.Call(ctx, "ask", budgetAsk(), step.WithBudget(none))
		return []outcome{describe(ctx, start, "ask", res, err)}, nil
	})
	if o := out[0]; o.Err != "" || o.Text != "free" {
		t.Fatalf("outcome %+v", o)
	}
	if st := statusOf(t, env, step.ActionID(parentID, "ask")); st.Ledger != nil {
		t.Fatalf("the action had a budget: %+v", st.Ledger)
	}
}
