package workflows

import (
	"time"

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
// which durallm's workers have (activities.Calls).
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
