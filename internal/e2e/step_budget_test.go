package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// A parent's budget across its calls (step.Budget) on the embedded
// server: the parents run on the user's own worker, each call on the
// durallm worker, against providertest, which reports each answer's
// usage and counts what it executed: the ground truth of what was spent.

// budgetUsage is what each answer reports: 160 tokens.
var budgetUsage = providertest.Usage{PromptTokens: 60, CompletionTokens: 100}

const budgetUsed = 160

// budgetCall is each call's input: a short prompt, at most 100 tokens out.
func budgetCall() workflows.ActionInput {
	in := actionInput(false)
	in.Request.Params = map[string]json.RawMessage{"max_tokens": json.RawMessage("100")}
	return in
}

// budgetWorst is one attempt's worst case: the prompt's bound and 100.
func budgetWorst(t *testing.T) (prompt, worst int64) {
	t.Helper()
	p, ok := budgetCall().Request.PromptTokenBound(0)
	if !ok {
		t.Fatal("no prompt bound")
	}
	return int64(p), int64(p) + 100
}

// budgetIn is the input of the parents below.
type budgetIn struct {
	Budget    step.Budget   `json:"budget"`
	TaskQueue string        `json:"task_queue"`
	Turns     int           `json:"turns,omitempty"`
	Patience  time.Duration `json:"patience,omitempty"`
	Continued bool          `json:"continued,omitempty"`
}

// budgetOut is what they report once every call they made has settled.
type budgetOut struct {
	Stopped      string          `json:"stopped,omitempty"`
	StopAttempts int             `json:"stop_attempts"`
	Early        []string        `json:"early,omitempty"`
	Most         workflows.Spend `json:"most"`
	Budget       step.Budget     `json:"budget"`
}

func registerBudgetParents(w sdkworker.Registry) {
	for _, wf := range []any{budgetTurns, budgetRetried, budgetAcrossContinueAsNew} {
		w.RegisterWorkflow(wf)
	}
}

// call makes one call under the budget and notes how it went: stopped
// (the budget's end) reports true.
func (out *budgetOut) call(ctx workflow.Context, in *budgetIn, name string) (stopped bool, err error) {
	opts := []step.Option{step.WithBudget(&in.Budget), step.TaskQueue(in.TaskQueue)}
	if in.Patience > 0 {
		opts = append(opts, step.ReturnIfAwaiting(in.Patience))
	}
	_, err = step.Call(ctx, name, budgetCall(), opts...)
	if c := in.Budget.Ledger().Committed(); c.Tokens > out.Most.Tokens {
		out.Most = c
	}
	var ae *durallm.ActionError
	switch {
	case errors.As(err, &ae) && ae.State == workflows.StateSpendExhausted:
		out.Stopped, out.StopAttempts = name, len(ae.Result.Attempts)
		return true, nil
	case errors.Is(err, durallm.ErrAwaitingReconciliation):
		out.Early = append(out.Early, name)
		return false, nil
	}
	return false, err
}

// settled waits for every call the budget holds, and reports.
func (out *budgetOut) settled(ctx workflow.Context, in *budgetIn) (budgetOut, error) {
	err := workflow.Await(ctx, func() bool { return in.Budget.Holding() == 0 })
	out.Budget = in.Budget
	return *out, err
}

// budgetTurns is a looping agent: one call a turn until the budget stops
// it, going on from a call awaiting its verdict after in.Patience.
func budgetTurns(ctx workflow.Context, in budgetIn) (budgetOut, error) {
	var out budgetOut
	for turn := 1; turn <= in.Turns; turn++ {
		stopped, err := out.call(ctx, &in, fmt.Sprintf("turn-%d", turn))
		if err != nil {
			return out, err
		}
		if stopped {
			break
		}
	}
	return out.settled(ctx, &in)
}

// budgetRetried calls "a", starts "b" and fails while b runs, on its
// first attempt. Its retry brings its budget up to date (Sync), makes
// "a" again, then "c", waits for what it holds, then calls "d", "e", ...
// until the budget stops it.
func budgetRetried(ctx workflow.Context, in budgetIn) (budgetOut, error) {
	var out budgetOut
	if workflow.GetInfo(ctx).Attempt == 1 {
		if _, err := out.call(ctx, &in, "a"); err != nil {
			return out, err
		}
		f := step.StartCall(ctx, "b", budgetCall(), step.WithBudget(&in.Budget), step.TaskQueue(in.TaskQueue))
		if err := f.Started().Get(ctx, nil); err != nil {
			return out, err
		}
		return out, temporal.NewApplicationError("the first run fails while b runs", "Planned")
	}
	// Before its first call, as a run that reads Left first would.
	if err := in.Budget.Sync(ctx, step.TaskQueue(in.TaskQueue)); err != nil {
		return out, err
	}
	for _, name := range []string{"a", "c", "d", "e", "f", "g"} {
		stopped, err := out.call(ctx, &in, name)
		if err != nil || stopped {
			if err == nil {
				return out.settled(ctx, &in)
			}
			return out, err
		}
		if name == "c" {
			// b's end, which the test lets come once c has run.
			if err := workflow.Await(ctx, func() bool { return in.Budget.Holding() == 0 }); err != nil {
				return out, err
			}
		}
	}
	return out.settled(ctx, &in)
}

// budgetAcrossContinueAsNew goes on from "turn-1", awaiting its verdict,
// and continues as new; the next run makes "turn-2" and "turn-3" at
// once and waits for all three.
func budgetAcrossContinueAsNew(ctx workflow.Context, in budgetIn) (budgetOut, error) {
	var out budgetOut
	if !in.Continued {
		if _, err := out.call(ctx, &in, "turn-1"); err != nil || len(out.Early) != 1 {
			return out, fmt.Errorf("want an early return: %w", err)
		}
		in.Continued = true
		return out, workflow.NewContinueAsNewError(ctx, budgetAcrossContinueAsNew, in)
	}
	wg := workflow.NewWaitGroup(ctx)
	var errs []error
	for _, name := range []string{"turn-2", "turn-3"} {
		wg.Add(1)
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer wg.Done()
			if _, err := out.call(ctx, &in, name); err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait(ctx)
	if err := errors.Join(errs...); err != nil {
		return out, err
	}
	return out.settled(ctx, &in)
}

// executedTokens is what the provider executed, at what its answers
// report: every executed request here is an answer.
func (s *stack) executedTokens() int64 {
	return int64(len(s.p.Processed())) * budgetUsed
}

// End to end: a 10-turn agent whose third call is
// ambiguous (the connection closed, the provider never ran it), returns
// early and gets its verdict (not_executed) only once the agent has
// stopped. The agent stops at the call that would overshoot, the eighth,
// which reaches no provider; the third call's reservation was held all
// along, and after the verdict it ran within it. What the provider
// executed, and what the calls committed at any turn, stayed within
// the budget.
func TestE2EStepAParentBudgetStopsATenCallAgentAtTheCallThatWouldOvershoot(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	prompt, worst := budgetWorst(t)
	answer := providertest.Answer("ok").WithUsage(budgetUsage)
	s.p.Push(answer, answer, providertest.GoAwayAfterProcessing(http2.ErrCodeNo).Processed(false))
	s.p.SetDefault(answer)
	limit := 6*budgetUsed + 2*worst + prompt + workflows.MinMaxTokens - 1
	in := budgetIn{Budget: step.Budget{Limit: workflows.Budget{Tokens: limit}, PerCall: workflows.Budget{Tokens: 2 * worst}},
		TaskQueue: s.tq, Turns: 10, Patience: time.Second}
	run := s.startParent("budget-agent", q, budgetTurns, in)
	// The agent has stopped and waits for the third call's end.
	s.waitState("budget-agent-turn-3", workflows.StateAwaitingReconciliation)
	s.waitState("budget-agent-turn-8", workflows.StateSpendExhausted)
	if err := s.c.Reconcile(context.Background(), "budget-agent-turn-3", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictNotExecuted, By: "test"}); err != nil {
		t.Fatal(err)
	}
	out := result[budgetOut](t, run)
	if out.Stopped != "turn-8" || out.StopAttempts != 0 || len(out.Early) != 1 || out.Early[0] != "turn-3" {
		t.Fatalf("stopped at %q (%d attempts), early %v; want turn-8 with nothing sent, turn-3 early", out.Stopped, out.StopAttempts, out.Early)
	}
	for turn := 1; turn <= 10; turn++ {
		id := fmt.Sprintf("budget-agent-turn-%d", turn)
		want := 1
		if turn >= 8 {
			want = 0
		}
		if n := s.p.ExecutedCount(id); n != want {
			t.Errorf("%s executed %d times, want %d", id, n, want)
		}
	}
	if n := len(s.p.Received()); n != 8 {
		t.Errorf("the provider received %d requests, want 8 (seven answers and the ambiguous one)", n)
	}
	if spent := s.executedTokens(); spent != 7*budgetUsed || spent > limit {
		t.Fatalf("the provider executed %d tokens, budget %d", spent, limit)
	}
	l := out.Budget.Ledger()
	if l.Settled.Tokens != 7*budgetUsed || len(l.Holds) != 0 || out.Most.Tokens > limit {
		t.Fatalf("ledger %+v, most committed %d, limit %d", l, out.Most.Tokens, limit)
	}
	if c := out.Budget.Calls[2]; c.Reserved.Tokens != 2*worst || c.Charged == nil || c.Charged.Tokens != budgetUsed {
		t.Fatalf("turn-3 %+v", c)
	}
}

// A parent's run that fails after spending, with a call still running,
// is retried (its RetryPolicy) with the input it began with, whose
// budget knows nothing of that run. The retry's first call brings the
// budget up to date from the failed run's history: the call that ended
// is charged what it committed and made again without a second
// execution, the one still running is held and followed to its end. The
// retry stops where the whole workflow's spending says, not where its
// own would.
func TestE2EStepARetriedParentCountsWhatItsFailedRunSpent(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	prompt, worst := budgetWorst(t)
	release := make(chan struct{})
	answer := providertest.Answer("ok").WithUsage(budgetUsage)
	s.p.Push(answer, answer.WaitFor(release))
	s.p.SetDefault(answer)
	// a, b, c, d and e fit; f has less than its least attempt.
	limit := 5*budgetUsed + prompt + workflows.MinMaxTokens - 1
	if left := limit - budgetUsed - 2*worst; left < worst {
		t.Fatalf("c would not have a whole attempt beside b's hold: %d", left)
	}
	in := budgetIn{Budget: step.Budget{Limit: workflows.Budget{Tokens: limit}, PerCall: workflows.Budget{Tokens: 2 * worst}}, TaskQueue: s.tq}
	run, err := s.tc.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{
		ID: "budget-retried", TaskQueue: q,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaximumAttempts: 2},
	}, budgetRetried, in)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.p.ExecutedCount("budget-retried-c") == 1 })
	close(release)
	out := result[budgetOut](t, run)
	if out.Stopped != "f" || out.StopAttempts != 0 {
		t.Fatalf("stopped at %q (%d attempts), want f with nothing sent", out.Stopped, out.StopAttempts)
	}
	for name, want := range map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 0, "g": 0} {
		if n := s.p.ExecutedCount("budget-retried-" + name); n != want {
			t.Errorf("%s executed %d times, want %d", name, n, want)
		}
	}
	if spent := s.executedTokens(); spent != 5*budgetUsed || spent > limit {
		t.Fatalf("the provider executed %d tokens, budget %d", spent, limit)
	}
	b := out.Budget
	l := b.Ledger()
	if l.Settled.Tokens != 5*budgetUsed || len(l.Holds) != 0 || out.Most.Tokens > limit {
		t.Fatalf("ledger %+v, most %d", l, out.Most.Tokens)
	}
	names := map[string]bool{}
	for _, c := range b.Calls {
		names[c.Name] = true
	}
	if len(b.Calls) != 6 || !names["a"] || !names["b"] || !names["f"] {
		t.Fatalf("calls %+v", b.Calls)
	}
}

// A run that continues as new while a call awaits its verdict hands the
// next run the call's reservation, held; the next run's calls, started
// at once, are reserved beside it after one look at where it stands
// (one BudgetCalls), and the budget learns the call's end when the
// verdict comes.
func TestE2EStepABudgetCarriesACallAwaitingItsVerdictAcrossContinueAsNew(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	_, worst := budgetWorst(t)
	answer := providertest.Answer("ok").WithUsage(budgetUsage)
	s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo).Processed(false))
	s.p.SetDefault(answer)
	// turn-2 has two worst cases beside turn-1's two, turn-3 the one
	// left.
	limit := 5 * worst
	in := budgetIn{Budget: step.Budget{Limit: workflows.Budget{Tokens: limit}, PerCall: workflows.Budget{Tokens: 2 * worst}}, TaskQueue: s.tq, Patience: time.Second}
	run := s.startParent("budget-continued", q, budgetAcrossContinueAsNew, in)
	waitFor(t, func() bool { return s.p.ExecutedCount("budget-continued-turn-3") == 1 })
	if err := s.c.Reconcile(context.Background(), "budget-continued-turn-1", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictNotExecuted, By: "test"}); err != nil {
		t.Fatal(err)
	}
	out := result[budgetOut](t, run)
	b := out.Budget
	if len(b.Calls) != 3 {
		t.Fatalf("calls %+v", b.Calls)
	}
	for i, want := range []int64{2 * worst, 2 * worst, worst} {
		c := b.Calls[i]
		charged := "nothing yet"
		if c.Charged != nil {
			charged = fmt.Sprint(c.Charged.Tokens)
		}
		if c.Name != fmt.Sprintf("turn-%d", i+1) || c.Reserved.Tokens != want || charged != fmt.Sprint(budgetUsed) {
			t.Fatalf("call %d: %s reserved %d, charged %s; want %d reserved, %d charged", i+1, c.Name, c.Reserved.Tokens, charged, want, budgetUsed)
		}
		if n := s.p.ExecutedCount("budget-continued-" + c.Name); n != 1 {
			t.Fatalf("%s executed %d times", c.Name, n)
		}
	}
	if s.executedTokens() != 3*budgetUsed {
		t.Fatalf("executed %d tokens", s.executedTokens())
	}
	asked := s.events("budget-continued", "", func(ev *historypb.HistoryEvent) bool {
		return ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() == workflows.BudgetCalls
	})
	if len(asked) != 1 {
		t.Fatalf("the second run asked BudgetCalls %d times, want once", len(asked))
	}
}
