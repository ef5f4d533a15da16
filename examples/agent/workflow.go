// Package agent is a small agent built on durallm: a workflow of your own
// that asks a model, runs the tool the model called as an activity, and
// asks again with the tool's result. Each question is one durable LLM
// action (step.Call), so a GOAWAY, a 421 or a killed worker never sends a
// request twice, and an ambiguous one waits for a verdict instead of
// guessing. See README.md.
package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/workflows"
)

// TaskQueue is the queue this example's own worker polls. The LLM calls
// run on the durallm workers' queue (Input.DurallmTaskQueue).
const TaskQueue = "agent"

// Input is one question for the agent.
type Input struct {
	// Question is the user's question, about an order.
	Question string `json:"question"`
	// Routes are the durallm route names to ask, in order. Empty means
	// the demo routes of `durallm dev`.
	Routes []string `json:"routes,omitempty"`
	// Stream streams the final answer, so an app can show it as it is
	// generated (starter/main.go subscribes to it).
	Stream bool `json:"stream,omitempty"`
	// DurallmTaskQueue is the queue the durallm workers poll. Empty means
	// "durallm".
	DurallmTaskQueue string `json:"durallm_task_queue,omitempty"`
}

// Output is the agent's answer and how it got there.
type Output struct {
	Answer string `json:"answer"`
	// Tool and ToolResult are the tool the model called and what it
	// returned; empty when it answered at once.
	Tool       string `json:"tool,omitempty"`
	ToolResult string `json:"tool_result,omitempty"`
	// Actions are the ids of the LLM actions the agent ran, for
	// `durallm status --id` and the Temporal UI.
	Actions []string `json:"actions"`
}

// The names of the agent's two calls: an action's id is the workflow's id
// plus the name, so an app can compute it (step.ActionID).
const (
	CallAsk    = "ask"
	CallAnswer = "answer"
)

// LookupOrderTool is the one tool the model may call.
var LookupOrderTool = json.RawMessage(`{"type":"function","function":{"name":"lookup_order","description":"Look up an order's status by its id.","parameters":{"type":"object","properties":{"order_id":{"type":"string","description":"The order id, e.g. 42."}},"required":["order_id"]}}}`)

// ToolCall is one tool call of a model's response (OpenAI's shape).
type ToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Agent answers a question about an order: it asks the model, runs the
// tool the model called, and asks again with the result.
func Agent(ctx workflow.Context, in Input) (Output, error) {
	log := workflow.GetLogger(ctx)
	routes := in.Routes
	if len(routes) == 0 {
		routes = []string{"demo-primary", "demo-fallback"}
	}
	opts := []step.Option{step.TaskQueue(in.DurallmTaskQueue)}
	msgs := []providers.Message{
		providers.TextMessage("system", "You answer questions about orders. Use lookup_order to find an order's status."),
		providers.TextMessage("user", in.Question),
	}
	ask := workflows.ActionInput{
		Request: providers.Request{Messages: msgs, Tools: []json.RawMessage{LookupOrderTool}},
		Routes:  routes,
	}
	var out Output
	// Each call's action id is known before it starts: an app behind
	// this workflow can look it up in the history or compute it.
	llm := func(name string, in workflows.ActionInput) (workflows.ActionResult, error) {
		f := step.StartCall(ctx, name, in, opts...)
		out.Actions = append(out.Actions, f.ActionID())
		return f.Get(ctx)
	}
	first, err := llm(CallAsk, ask)
	if err != nil {
		return out, failed(CallAsk, err)
	}
	call, ok, err := firstToolCall(first.Response)
	if err != nil {
		return out, temporal.NewNonRetryableApplicationError(err.Error(), "BadToolCall", err)
	}
	if !ok {
		out.Answer = first.Response.Text
		return out, nil
	}
	log.Info("the model called a tool", "tool", call.Function.Name)

	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 30 * time.Second})
	var a *Activities
	var result string
	if err := workflow.ExecuteActivity(actx, a.LookupOrder, call.Function.Arguments).Get(ctx, &result); err != nil {
		return out, fmt.Errorf("lookup_order: %w", err)
	}
	out.Tool, out.ToolResult = call.Function.Name, result

	again := ask
	again.Request.Messages = append(append([]providers.Message(nil), msgs...),
		providers.Message{Role: "assistant", ToolCalls: first.Response.ToolCalls},
		providers.Message{Role: "tool", ToolCallID: call.ID, Content: jsonString(result)},
	)
	again.Request.Stream = in.Stream
	second, err := llm(CallAnswer, again)
	if err != nil {
		return out, failed(CallAnswer, err)
	}
	out.Answer = second.Response.Text
	return out, nil
}

// failed says how a call ended when it did not answer, deciding on the
// typed errors, never on text: canceled with this workflow, a rejected
// request (not worth retrying), an ambiguous one left unresolved, or
// failed.
func failed(name string, err error) error {
	var ae *durallm.ActionError
	if errors.As(err, &ae) {
		msg := fmt.Sprintf("the %s call ended %s (%s)", name, ae.State, ae.Reason)
		switch {
		case ae.Origin == workflows.OriginParentCanceled:
			// This workflow was canceled, and its call with it.
			return temporal.NewCanceledError(msg)
		case ae.State == workflows.StateRejected:
			return temporal.NewNonRetryableApplicationError(msg, "ModelRejected", err)
		case ae.State == workflows.StateIndeterminate:
			return temporal.NewNonRetryableApplicationError(msg+": nobody could tell whether the provider ran it", "ModelIndeterminate", err)
		}
		return temporal.NewApplicationErrorWithCause(msg, "ModelFailed", err)
	}
	return fmt.Errorf("the %s call: %w", name, err)
}

// firstToolCall is the first tool call of r, if it has one.
func firstToolCall(r *providers.Response) (ToolCall, bool, error) {
	if r == nil || len(r.ToolCalls) == 0 {
		return ToolCall{}, false, nil
	}
	var calls []ToolCall
	if err := json.Unmarshal(r.ToolCalls, &calls); err != nil {
		return ToolCall{}, false, fmt.Errorf("the model's tool_calls are not OpenAI's shape: %w", err)
	}
	if len(calls) == 0 {
		return ToolCall{}, false, nil
	}
	return calls[0], true, nil
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
