package actiontest

import (
	"errors"
	"time"

	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/workflows"
)

// cancelDelivery is how long after its cancel a scripted attempt settles:
// a real attempt learns of its cancel from its next heartbeat (every
// 250ms, sent on by the worker's heartbeat throttle), aborts its exchange
// and reports, within about a second (docs/workflow.md, "Cancellation").
const cancelDelivery = time.Second

// Interceptor returns the worker interceptor Register installs in the
// environment. It makes a canceled attempt settle as on a Temporal
// server: the SDK's test environment settles a canceled activity at once
// and drops what it returns (it ignores WaitForCancellation), so the
// attempt would have no evidence and a cancel after the commit no text.
// With it, a canceled attempt settles cancelDelivery later, as a
// cancellation carrying its outcome: the request sent on its connection
// and stream, and whatever content it had delivered. It touches LLMAction
// only. A test that sets the environment's worker options after Register
// puts it among their Interceptors.
func (a *Actions) Interceptor() interceptor.WorkerInterceptor { return &workerInterceptor{a: a} }

type workerInterceptor struct {
	interceptor.WorkerInterceptorBase
	a *Actions
}

func (w *workerInterceptor) InterceptWorkflow(ctx workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	if workflow.GetInfo(ctx).WorkflowType.Name != workflows.WorkflowName {
		return next
	}
	return &inbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}, a: w.a}
}

type inbound struct {
	interceptor.WorkflowInboundInterceptorBase
	a *Actions
}

func (i *inbound) Init(out interceptor.WorkflowOutboundInterceptor) error {
	return i.Next.Init(&outbound{WorkflowOutboundInterceptorBase: interceptor.WorkflowOutboundInterceptorBase{Next: out}, a: i.a})
}

type outbound struct {
	interceptor.WorkflowOutboundInterceptorBase
	a *Actions
}

// ExecuteActivity hands LLMAction a future of its own for each attempt:
// the environment's, unless the environment settled the attempt as
// canceled with nothing, in which case the attempt's own outcome, a
// little later.
func (o *outbound) ExecuteActivity(ctx workflow.Context, activityType string, args ...any) workflow.Future {
	fut := o.Next.ExecuteActivity(ctx, activityType, args...)
	if activityType != attempt.CallModel || len(args) != 1 {
		return fut
	}
	in, ok := args[0].(attempt.Input)
	if !ok {
		return fut
	}
	o.a.mu.Lock()
	o.a.intercepted[in.AttemptID] = true
	o.a.mu.Unlock()
	scheduled := workflow.Now(ctx)
	settled, set := workflow.NewFuture(ctx)
	// Disconnected: the attempt settles after its cancel.
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	workflow.Go(dctx, func(ctx workflow.Context) {
		var out attempt.Outcome
		err := fut.Get(ctx, &out)
		var canceled *temporal.CanceledError
		if errors.As(err, &canceled) && !canceled.HasDetails() {
			_ = workflow.Sleep(ctx, cancelDelivery)
			if c, ok := o.a.canceled(in, workflow.Now(ctx).Sub(scheduled)); ok {
				// As Temporal reports the real activity's: a
				// cancellation whose details are the outcome.
				set.Set(nil, temporal.NewCanceledError(c))
				return
			}
		}
		if err != nil {
			set.Set(nil, err)
			return
		}
		set.Set(out, nil)
	})
	return settled
}
