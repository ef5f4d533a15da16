package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"go.temporal.io/sdk/temporal"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/workflows"
)

// Activities are the agent's tools, and the read of an answer stored by
// reference. Register them with w.RegisterActivity(&agent.Activities{...}).
type Activities struct {
	// Orders are the known orders' statuses by id. Nil means DemoOrders.
	Orders map[string]string
	// Documents are the documents read_document reads, by name. Nil
	// means DemoDocuments.
	Documents map[string]string
	// Results is the result store the durallm workers keep answers too
	// large for history in: the store the agent's worker gives
	// durallm.DataConverter. Nil: such an answer cannot be read, and the
	// agent fails saying so.
	Results resultstore.Store
}

// DemoOrders are the orders the example knows. "demo" is the id the demo
// provider of `durallm dev` fills in when it calls the tool.
var DemoOrders = map[string]string{
	"42":   "shipped on Monday, arriving Thursday",
	"demo": "packed, leaving the warehouse today",
}

// DemoDocuments are the documents the example knows.
var DemoDocuments = map[string]string{
	"returns": "Returns are accepted within 30 days of delivery, unused and in their packaging.",
}

// LookupOrder is the lookup_order tool: arguments is the model's JSON
// object, {"order_id": "..."}. It returns the status as text; an unknown
// order is an answer for the model too, not a failure.
func (a *Activities) LookupOrder(_ context.Context, arguments string) (string, error) {
	var args struct {
		OrderID string `json:"order_id"`
	}
	if err := json.Unmarshal([]byte(arguments), &args); err != nil || args.OrderID == "" {
		// The model's arguments will not improve on a retry.
		return "", temporal.NewNonRetryableApplicationError(`lookup_order: arguments must be {"order_id": "..."}`, "BadArguments", err)
	}
	orders := a.Orders
	if orders == nil {
		orders = DemoOrders
	}
	status, ok := orders[args.OrderID]
	if !ok {
		return fmt.Sprintf("order %s: not found", args.OrderID), nil
	}
	return fmt.Sprintf("order %s: %s", args.OrderID, status), nil
}

// ReadDocument is the read_document tool: arguments is {"name": "..."}.
// It returns the document's whole text, however long: the conversation
// that carries it on travels by reference under durallm.DataConverter.
func (a *Activities) ReadDocument(_ context.Context, arguments string) (string, error) {
	var args struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(arguments), &args); err != nil || args.Name == "" {
		return "", temporal.NewNonRetryableApplicationError(`read_document: arguments must be {"name": "..."}`, "BadArguments", err)
	}
	docs := a.Documents
	if docs == nil {
		docs = DemoDocuments
	}
	text, ok := docs[args.Name]
	if !ok {
		return fmt.Sprintf("document %s: not found", args.Name), nil
	}
	return text, nil
}

// ReadResponse reads the answer a durallm worker stored by reference
// (ActionResult.ResultRef) from the result store.
func (a *Activities) ReadResponse(ctx context.Context, ref string) (providers.Response, error) {
	if a.Results == nil {
		return providers.Response{}, temporal.NewNonRetryableApplicationError(
			"the answer is stored by reference and this worker has no result store: set Activities.Results to the durallm workers' store", "NoResultStore", nil)
	}
	res := workflows.ActionResult{ResultRef: ref}
	err := durallm.ResolveResponse(ctx, a.Results, &res)
	switch {
	case errors.Is(err, resultstore.ErrNotFound), errors.Is(err, resultstore.ErrDamaged):
		// Not there, or not what was stored: reading again will not help.
		return providers.Response{}, temporal.NewNonRetryableApplicationError(err.Error(), "AnswerUnreadable", err)
	case err != nil:
		return providers.Response{}, err
	case res.Response == nil:
		return providers.Response{}, temporal.NewNonRetryableApplicationError("the answer's reference is not the result store's", "AnswerUnreadable", nil)
	}
	return *res.Response, nil
}
