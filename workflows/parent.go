package workflows

import "go.temporal.io/sdk/workflow"

// tellParent signals the parent of an action started with NotifyParent
// when the action enters or leaves awaiting_reconciliation (package
// step's early return). It does not wait for the signal: a parent that
// has already closed is no reason for the action to stop.
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
		n.Attempt = w.status.AwaitingAttempt
	}
	_ = workflow.SignalExternalWorkflow(w.actx, p.ID, p.RunID, ParentSignalName(w.status.ActionRef), n)
}
