package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/durallm/durallm/workflows"
)

// Calls are the activities package step runs on the durallm task queue to
// reach an action that is not a child of the calling run
// (workflows.DescribeCall, workflows.AwaitCall): one an earlier run of the
// same workflow started, or one attached by id. They only read, through a
// Temporal client. Worker registers them; to host durallm in a worker of
// your own, register &worker.Calls{Client: c} beside Register.
type Calls struct {
	// Client reads the actions. Required.
	Client client.Client
	// HeartbeatEvery is how often AwaitCall heartbeats while it waits.
	// Zero means 5s.
	HeartbeatEvery time.Duration
}

// DescribeCall says where the action stands now: not found, ended (with
// its result), running, and with q.Awaiting whether it awaits a verdict;
// with q.Chain, whether another workflow than the caller's run chain
// started it.
func (c *Calls) DescribeCall(ctx context.Context, q workflows.CallQuery) (workflows.CallPosition, error) {
	pos, _, err := c.position(ctx, q)
	return pos, err
}

// AwaitCall returns once the action stands elsewhere than q.Known: it
// ended, or (with q.Awaiting) its wait for a verdict began, moved to
// another attempt or ended. It looks again after each new event of the
// action's history, heartbeating meanwhile.
func (c *Calls) AwaitCall(ctx context.Context, q workflows.CallQuery) (workflows.CallPosition, error) {
	stop := c.heartbeat(ctx)
	defer stop()
	if !q.Awaiting {
		pos := workflows.CallPosition{Found: true, RunID: q.RunID}
		res, err := c.result(ctx, q.ActionRef, q.RunID)
		if err != nil {
			return pos, err
		}
		pos.Ended, pos.Result = true, &res
		return pos, nil
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := c.Client.GetWorkflowHistory(hctx, q.ActionRef, q.RunID, true, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for {
		pos, seen, err := c.position(ctx, q)
		if err != nil || !pos.Found || pos.Ended || moved(pos, q.Known) {
			if err == nil && !pos.Found {
				err = temporal.NewNonRetryableApplicationError("action "+q.ActionRef+" not found", workflows.CallNotFoundType, nil)
			}
			return pos, err
		}
		// Until an event the position above did not see.
		for {
			if !events.HasNext() {
				// The history ended: the action closed, which the next
				// look finds. Never a busy loop, whatever the server says.
				select {
				case <-ctx.Done():
					return pos, ctx.Err()
				case <-time.After(time.Second):
				}
				break
			}
			ev, err := events.Next()
			if err != nil {
				return pos, fmt.Errorf("durallm: history of %s: %w", q.ActionRef, err)
			}
			if ev.GetEventId() > seen {
				break
			}
		}
	}
}

// moved reports whether pos is another place than known.
func moved(pos, known workflows.CallPosition) bool {
	return pos.Awaiting != known.Awaiting || pos.Attempt != known.Attempt
}

// position looks at the action once, and returns the length of the
// history it saw.
func (c *Calls) position(ctx context.Context, q workflows.CallQuery) (workflows.CallPosition, int64, error) {
	var pos workflows.CallPosition
	d, err := c.Client.DescribeWorkflowExecution(ctx, q.ActionRef, q.RunID)
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return pos, 0, nil
	}
	if err != nil {
		return pos, 0, fmt.Errorf("durallm: describe %s: %w", q.ActionRef, err)
	}
	info := d.GetWorkflowExecutionInfo()
	pos.Found, pos.RunID = true, info.GetExecution().GetRunId()
	if q.Chain != "" {
		if pos.OtherChain, err = c.otherChain(ctx, info.GetParentExecution().GetWorkflowId(), info.GetParentExecution().GetRunId(), q); err != nil {
			return pos, 0, err
		}
	}
	if info.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		res, err := c.result(ctx, q.ActionRef, pos.RunID)
		if err != nil {
			return pos, 0, err
		}
		pos.Ended, pos.Result = true, &res
		return pos, info.GetHistoryLength(), nil
	}
	if q.Awaiting {
		v, err := c.Client.QueryWorkflow(ctx, q.ActionRef, pos.RunID, workflows.QueryStatus)
		var st workflows.Status
		if err == nil {
			err = v.Get(&st)
		}
		if err != nil {
			return pos, 0, fmt.Errorf("durallm: status of %s: %w", q.ActionRef, err)
		}
		if st.State == workflows.StateAwaitingReconciliation {
			pos.Awaiting, pos.Attempt, pos.Since = true, st.AwaitingAttempt, st.AwaitingSince
		}
	}
	return pos, info.GetHistoryLength(), nil
}

// otherChain says whether the run parentID/parentRun that started an
// action belongs to another workflow than the caller's run chain. An
// action no workflow started is another's; a starting run Temporal no
// longer keeps cannot be told, and counts as the caller's, so that a
// call is never made twice.
func (c *Calls) otherChain(ctx context.Context, parentID, parentRun string, q workflows.CallQuery) (bool, error) {
	switch {
	case parentID == "":
		return true, nil
	case parentID != q.ParentID:
		return true, nil
	case parentRun == q.Chain:
		return false, nil
	}
	d, err := c.Client.DescribeWorkflowExecution(ctx, parentID, parentRun)
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("durallm: describe the parent of %s: %w", q.ActionRef, err)
	}
	first := d.GetWorkflowExecutionInfo().GetFirstRunId()
	return first != "" && first != q.Chain, nil
}

// result waits for the action's result. An action that failed on its
// input, or whose workflow closed without a result, is a non-retryable
// error: waiting again changes nothing.
func (c *Calls) result(ctx context.Context, id, runID string) (workflows.ActionResult, error) {
	var res workflows.ActionResult
	err := c.Client.GetWorkflow(ctx, id, runID).Get(ctx, &res)
	if err == nil {
		return res, nil
	}
	var app *temporal.ApplicationError
	var closed *temporal.WorkflowExecutionError
	var nf *serviceerror.NotFound
	switch {
	case ctx.Err() != nil:
		return res, fmt.Errorf("durallm: waiting for %s: %w", id, ctx.Err())
	case errors.As(err, &app) && app.Type() == workflows.InvalidInputType:
		return res, temporal.NewNonRetryableApplicationError(app.Message(), workflows.InvalidInputType, nil)
	case errors.As(err, &closed):
		return res, temporal.NewNonRetryableApplicationError(err.Error(), workflows.CallClosedType, nil)
	case errors.As(err, &nf):
		return res, temporal.NewNonRetryableApplicationError("action "+id+" not found", workflows.CallNotFoundType, nil)
	}
	return res, fmt.Errorf("durallm: waiting for %s: %w", id, err)
}

// heartbeat heartbeats until stop is called, so that a canceled wait
// learns of it and a lost worker's wait is retried elsewhere.
func (c *Calls) heartbeat(ctx context.Context) (stop func()) {
	every := c.HeartbeatEvery
	if every <= 0 {
		every = 5 * time.Second
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			activity.RecordHeartbeat(ctx)
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done) }
}
