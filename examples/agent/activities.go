package agent

import (
	"context"
	"encoding/json"
	"fmt"

	"go.temporal.io/sdk/temporal"
)

// Activities are the agent's tools. Register them with
// w.RegisterActivity(&agent.Activities{...}).
type Activities struct {
	// Orders are the known orders' statuses by id. Nil means
	// DemoOrders.
	Orders map[string]string
}

// DemoOrders are the orders the example knows. "demo" is the id the demo
// provider of `durallm dev` fills in when it calls the tool.
var DemoOrders = map[string]string{
	"42":   "shipped on Monday, arriving Thursday",
	"demo": "packed, leaving the warehouse today",
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
		return "", temporal.NewNonRetryableApplicationError("lookup_order: arguments must be {\"order_id\": \"...\"}", "BadArguments", err)
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
