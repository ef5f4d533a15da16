package workflows

import (
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// tellParent signals the parent of an action started with NotifyParent
// when the action enters or leaves awaiting_reconciliation (package
// step's early return). It does not wait for the signal: a parent that
// has already closed is no reason for the action to stop.
//
// The signal goes to the parent's id without a run id, so it reaches the
// run that is current: after a reset, a retry or a Continue-As-New of
// the parent, the run now waiting for the call, not the closed one that
// started it.
func (w *action) tellParent(prev, next State) {
	p := w.info.ParentWorkflowExecution
	if !w.in.NotifyParent || p == nil || prev == next {
		return
	}
	entering := next == StateAwaitingReconciliation
	leaving := prev == StateAwaitingReconciliation && !next.Terminal()
	if !entering && !leaving {
		return
	}
	n := AwaitingNotice{ActionRef: w.status.ActionRef, Awaiting: entering}
	if entering {
		n.Attempt, n.Since = w.status.AwaitingAttempt, w.status.AwaitingSince
	}
	_ = workflow.SignalExternalWorkflow(w.actx, p.ID, "", ParentSignalName(w.status.ActionRef), n)
}

// The activities package step runs on the durallm task queue to reach an
// action that is not a child of the calling run: one an earlier run of
// the same workflow started (a retry, a reset, Continue-As-New), or one
// attached by its id (step.Attach). Workflow code can wait only for the
// children its own run started; these wait through a Temporal client,
// which durallm's workers have (worker.Calls).
const (
	// DescribeCall answers a CallQuery with where the action stands now.
	DescribeCall = "DescribeCall"
	// AwaitCall answers a CallQuery once the action stands elsewhere than
	// CallQuery.Known: ended, or (with CallQuery.Awaiting) awaiting a
	// verdict on another attempt, or no longer awaiting one. It
	// heartbeats while it waits and is canceled through them.
	AwaitCall = "AwaitCall"
)

// CallQuery asks DescribeCall or AwaitCall about one action.
type CallQuery struct {
	ActionRef string `json:"action_ref"`
	// RunID is the action's run once known; empty means its latest.
	RunID string `json:"run_id,omitempty"`
	// ParentID and Chain name the calling workflow and its run chain
	// (WorkflowInfo.FirstRunID, which a retry, a reset, a cron run and
	// Continue-As-New keep): DescribeCall then says whether the action
	// was started by another workflow (CallPosition.OtherChain). Empty
	// means do not check.
	ParentID string `json:"parent_id,omitempty"`
	Chain    string `json:"chain,omitempty"`
	// Awaiting asks about awaiting_reconciliation too, not only the end.
	Awaiting bool `json:"awaiting,omitempty"`
	// Known is where the caller last saw the action (AwaitCall).
	Known CallPosition `json:"known,omitzero"`
}

// CallPosition is where an action stands.
type CallPosition struct {
	// Found is false when Temporal keeps no action under the id.
	Found bool   `json:"found"`
	RunID string `json:"run_id,omitempty"`
	// OtherChain says the action was started by another workflow than the
	// caller's run chain: another workflow under the same id, or no
	// workflow at all (a client). Unknown (the starting run is no longer
	// kept) counts as the caller's own.
	OtherChain bool `json:"other_chain,omitempty"`
	// Ended, with the action's result.
	Ended  bool          `json:"ended,omitempty"`
	Result *ActionResult `json:"result,omitempty"`
	// Awaiting a verdict on Attempt since Since (when CallQuery.Awaiting).
	Awaiting bool      `json:"awaiting,omitempty"`
	Attempt  int       `json:"attempt,omitempty"`
	Since    time.Time `json:"since,omitzero"`
}

// The types of the non-retryable application errors DescribeCall and
// AwaitCall end with, besides InvalidInputType for an action that failed
// on its input.
const (
	// CallNotFoundType: Temporal keeps no action under the id.
	CallNotFoundType = "ActionNotFound"
	// CallClosedType: the action's workflow closed without a result
	// (terminated, timed out).
	CallClosedType = "ActionClosed"
)

// BudgetCalls is the activity package step runs, on the durallm task
// queue, to bring a parent's budget (step.Budget) up to date at the first
// call a run makes under it, when the run carries reservations of calls
// an earlier run made (Continue-As-New) or retries a run that failed: it
// answers a BudgetQuery with where each of those calls stands and what it
// committed. It only reads, through a Temporal client.
const BudgetCalls = "BudgetCalls"

// BudgetMemo is the memo key of an action started under a parent's
// budget (step.WithBudget); its value is the budget's name (step.Budget's
// Name, often empty). A retried run finds the calls the runs it retries
// made under its budget by it.
const BudgetMemo = "durallm-budget"

// BudgetQuery asks BudgetCalls about the calls of one parent's budget.
type BudgetQuery struct {
	// ParentID is the calling workflow's id.
	ParentID string `json:"parent_id"`
	// Held are the ids of the actions the budget holds a reservation for,
	// made by an earlier run: each is answered.
	Held []string `json:"held,omitempty"`
	// Retried is the run the calling run retries (its
	// WorkflowInfo.ContinuedExecutionRunID, when its Attempt is above 1);
	// empty for none. The actions that run started under the budget, and
	// those of the runs it retried in turn, are answered too, but for the
	// ones in Known.
	Retried string `json:"retried,omitempty"`
	// Budget is the budget's name, BudgetMemo's value.
	Budget string `json:"budget,omitempty"`
	// Known are the ids of the actions the budget already counts.
	Known []string `json:"known,omitempty"`
}

// CallSpend is where one action a parent's budget counts stands, and
// what it committed.
type CallSpend struct {
	ActionRef string `json:"action_ref"`
	// Found is false when Temporal keeps no action under the id.
	Found bool   `json:"found"`
	RunID string `json:"run_id,omitempty"`
	// Ended: the action ended, and Committed is final.
	Ended bool `json:"ended,omitempty"`
	// Limit is the action's own budget, the most it may commit; nil when
	// it has none or its status cannot be read.
	Limit *Budget `json:"limit,omitempty"`
	// Committed is what the action's attempts committed (settled plus
	// held: its ledger's), or for one without a budget its usage and
	// cost; nil when its status cannot be read (a workflow closed without
	// a result: terminated, timed out).
	Committed *Spend `json:"committed,omitempty"`
}

// SpendOf is what BudgetCalls answers for action id, found under run
// runID: from its status st (its result's, once ended) or, for one that
// ended, the error reading its result gave: an action that failed on its
// input (InvalidInputType) dispatched nothing; one whose workflow closed
// without a result (CallClosedType) committed what nothing says.
func SpendOf(id, runID string, ended bool, st Status, readErr error) (CallSpend, error) {
	s := CallSpend{ActionRef: id, Found: true, RunID: runID, Ended: ended}
	var app *temporal.ApplicationError
	switch {
	case errors.As(readErr, &app) && app.Type() == InvalidInputType:
		s.Committed = &Spend{}
		return s, nil
	case errors.As(readErr, &app) && app.Type() == CallClosedType:
		return s, nil
	case readErr != nil:
		return s, readErr
	}
	committed := st.Committed()
	s.Committed = &committed
	if st.Ledger != nil {
		limit := st.Ledger.Limit
		s.Limit = &limit
	}
	return s, nil
}
