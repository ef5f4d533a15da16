package agent

import (
	"encoding/json"
	"fmt"

	"github.com/durallm/durallm/providers"
)

// The tools the model may call, declared in every call.
var (
	LookupOrderTool  = json.RawMessage(`{"type":"function","function":{"name":"lookup_order","description":"Look up an order's status by its id.","parameters":{"type":"object","properties":{"order_id":{"type":"string","description":"The order id, e.g. 42."}},"required":["order_id"]}}}`)
	ReadDocumentTool = json.RawMessage(`{"type":"function","function":{"name":"read_document","description":"Read a policy document by its name, e.g. returns.","parameters":{"type":"object","properties":{"name":{"type":"string","description":"The document's name."}},"required":["name"]}}}`)
	Tools            = []json.RawMessage{LookupOrderTool, ReadDocumentTool}
)

// toolActivity is the activity that runs the tool name, nil for none.
func toolActivity(name string) any {
	var a *Activities
	switch name {
	case "lookup_order":
		return a.LookupOrder
	case "read_document":
		return a.ReadDocument
	}
	return nil
}

// ToolCall is one tool call of a model's response (OpenAI's shape).
type ToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// toolCalls are r's tool calls, in the order the model made them.
func toolCalls(r providers.Response) ([]ToolCall, error) {
	if len(r.ToolCalls) == 0 {
		return nil, nil
	}
	var calls []ToolCall
	if err := json.Unmarshal(r.ToolCalls, &calls); err != nil {
		return nil, fmt.Errorf("the model's tool_calls are not OpenAI's shape: %w", err)
	}
	for i, c := range calls {
		if c.ID == "" {
			return nil, fmt.Errorf("the model's tool call %d has no id: its result could not be sent back", i)
		}
	}
	return calls, nil
}
