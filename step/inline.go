package step

import (
	"encoding/json"
	"fmt"

	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/workflows"
)

// inlineMargin is room for a payload's metadata beside its JSON.
const inlineMargin = 1 << 10

// checkInline refuses an input the calling workflow's worker would send
// inline although it is larger than Temporal takes in one payload: the
// SDK would fail the workflow's task for ever (PayloadsTooLarge) and the
// call would never return. A worker dialed with durallm.DataConverter
// stores such an input by reference instead (claimcheck.Active), and
// refuses, as the call's error, only one larger than its store keeps.
// Both are deterministic: the worker's converter and the input decide.
func checkInline(ctx workflow.Context, in workflows.ActionInput) error {
	if claimcheck.Active(ctx) {
		return nil
	}
	b, err := json.Marshal(in)
	if err != nil || len(b)+inlineMargin <= claimcheck.InlineLimit {
		return nil // a value the converter cannot encode is its error to report
	}
	return &workflows.InputError{Problems: []error{fmt.Errorf(
		"request: the call's input is %d bytes, over Temporal's %d-byte payload limit, and this workflow's worker would put it in history: "+
			"dial the worker's Temporal client with durallm.DataConverter(store) so that it is stored by reference; nothing was started",
		len(b), claimcheck.InlineLimit)}}
}
