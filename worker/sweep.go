package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/durallm/durallm/journal"
)

// DefaultJournalSweepEvery is how often a worker sweeps its journal and
// its result store.
const DefaultJournalSweepEvery = time.Hour

// sweeper is journal.Sweeper and resultstore.Sweeper.
type sweeper interface {
	Run(ctx context.Context, every time.Duration)
}

// TemporalActions is journal.Actions on a Temporal client: it describes
// the action's workflow (its latest run). A workflow the server no longer
// knows is closed: its history is past the namespace's retention.
func TemporalActions(c client.Client) journal.Actions { return temporalActions{c} }

type temporalActions struct{ c client.Client }

func (a temporalActions) Closed(ctx context.Context, actionRef string) (time.Time, bool, error) {
	d, err := a.c.DescribeWorkflowExecution(ctx, actionRef, "")
	var nf *serviceerror.NotFound
	if errors.As(err, &nf) {
		return time.Time{}, true, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("describe %s: %w", actionRef, err)
	}
	info := d.GetWorkflowExecutionInfo()
	if info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING || info.GetCloseTime() == nil {
		return time.Time{}, false, nil
	}
	return info.GetCloseTime().AsTime(), true, nil
}
