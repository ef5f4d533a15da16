// Package agent is an agent built on durallm: a workflow of your own that
// loops as a model asks it to. Each turn it calls the model with the
// conversation so far; when the model calls tools it runs every one of
// them as an activity, in parallel, sends back one result per call, and
// calls the model again, until an answer calls no tool. Each call is one
// durable LLM action (package step), named after its turn, so a GOAWAY, a
// 421, a killed worker, a retry or a Continue-As-New never sends a turn
// twice, and an ambiguous one waits for a verdict instead of guessing.
// Every few turns the agent continues as new, carrying its conversation
// and its turn count. A "stop" signal ends it, canceling the call in
// flight. See README.md.
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

// SignalStop is the signal that stops a running agent: the call in
// flight is canceled (the action ends canceled, parent_canceled, unless
// its answer came first) and the agent ends with Output.Stopped. Its
// payload, if any, is ignored.
const SignalStop = "stop"

// The defaults of Input.MaxTurns and Input.TurnsPerRun.
const (
	DefaultMaxTurns    = 50
	DefaultTurnsPerRun = 10
)

// Input is one question for the agent, and on a later run what the runs
// before it did.
type Input struct {
	// Question is the user's question, about orders.
	Question string `json:"question"`
	// Routes are the durallm route names to ask, in order. Empty means
	// the demo routes of `durallm dev`.
	Routes []string `json:"routes,omitempty"`
	// Stream streams every turn's answer, so an app can show it as it is
	// generated (starter/main.go follows each turn's stream).
	Stream bool `json:"stream,omitempty"`
	// DurallmTaskQueue is the queue the durallm workers poll. Empty means
	// "durallm".
	DurallmTaskQueue string `json:"durallm_task_queue,omitempty"`
	// MaxTurns bounds the loop: a model still calling tools at the last
	// turn fails the agent (TooManyTurns). Zero means DefaultMaxTurns.
	MaxTurns int `json:"max_turns,omitempty"`
	// TurnsPerRun is how many turns a run makes before it continues as
	// new, which keeps each run's history short. Zero means
	// DefaultTurnsPerRun.
	TurnsPerRun int `json:"turns_per_run,omitempty"`
	// State is what the runs before this one did; nil on the first run.
	State *State `json:"state,omitempty"`
}

// State is what a run hands the next across Continue-As-New. Under a
// worker dialed with durallm.DataConverter the conversation travels by
// reference, whatever its size.
type State struct {
	// Turn is the last turn made, counted across every run: the next
	// run's first call is turn-(Turn+1), so no call name comes twice.
	Turn int `json:"turn"`
	// Conversation is every message so far: the system prompt and the
	// question, each answer and each tool's result.
	Conversation []providers.Message `json:"conversation"`
	// Output is the output so far.
	Output Output `json:"output"`
}

// Output is the agent's answer and how it got there.
type Output struct {
	// Answer is the model's last answer, the one that called no tool.
	Answer string `json:"answer"`
	// Incomplete says why Answer is cut short (a stream cut after it
	// began, providers.Incomplete*), empty when it is whole.
	Incomplete string `json:"incomplete,omitempty"`
	// Turns is how many calls the agent made.
	Turns int `json:"turns"`
	// Tools are the tools the model called, turn by turn, in the order
	// of its calls.
	Tools []ToolRun `json:"tools,omitempty"`
	// Actions are the ids of the LLM actions the agent ran, one per turn,
	// for `durallm status --id` and the Temporal UI.
	Actions []string `json:"actions"`
	// Stopped says the agent ended on a stop signal; Answer is then the
	// call's answer if it came before the stop, else empty.
	Stopped bool `json:"stopped,omitempty"`
}

// ToolRun is one tool call the agent answered.
type ToolRun struct {
	Turn int    `json:"turn"`
	ID   string `json:"id"`
	Name string `json:"name"`
}

// CallName is the name of turn n's call, "turn-<n>": its action id is the
// workflow's id, "-" and the name (step.ActionID), the same across the
// agent's runs, so an app can compute it (starter/main.go follows each
// turn's stream by it).
func CallName(turn int) string { return fmt.Sprintf("turn-%d", turn) }

// systemPrompt opens every conversation.
const systemPrompt = "You answer questions about orders. Use lookup_order to find an order's status and read_document to read a policy document."

// Agent answers a question, calling the model and the tools it asks for
// until it answers without a tool.
func Agent(ctx workflow.Context, in Input) (Output, error) {
	log := workflow.GetLogger(ctx)
	maxTurns, perRun := orDefault(in.MaxTurns, DefaultMaxTurns), orDefault(in.TurnsPerRun, DefaultTurnsPerRun)
	st := in.State
	if st == nil {
		st = &State{Conversation: []providers.Message{
			providers.TextMessage("system", systemPrompt),
			providers.TextMessage("user", in.Question),
		}}
	}
	stop := workflow.GetSignalChannel(ctx, SignalStop)
	firstTurn := st.Turn + 1
	for {
		// A stop that arrived while the tools ran.
		if stop.ReceiveAsync(nil) {
			st.Output.Stopped = true
			return st.Output, nil
		}
		turn := st.Turn + 1
		if turn > maxTurns {
			return st.Output, temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("the model still called tools after %d turns", maxTurns), "TooManyTurns", nil)
		}
		if turn-firstTurn == perRun {
			log.Info("continuing as new", "turn", turn)
			next := in
			next.State = st
			return Output{}, workflow.NewContinueAsNewError(ctx, Agent, next)
		}

		res, stopped, err := ask(ctx, in, st, turn, stop)
		st.Turn, st.Output.Turns = turn, turn
		if stopped && isOurCancel(err) {
			st.Output.Stopped = true
			return st.Output, nil
		}
		if err != nil {
			return st.Output, failed(CallName(turn), err)
		}
		resp, err := response(ctx, res)
		if err != nil {
			return st.Output, err
		}
		calls, err := toolCalls(resp)
		if err != nil {
			return st.Output, temporal.NewNonRetryableApplicationError(err.Error(), "BadToolCall", err)
		}
		// A stream cut after it began has committed: what arrived is the
		// answer, and a cut tool call cannot be run.
		if stopped || len(calls) == 0 || res.State == workflows.StateCompletedPartial {
			st.Output.Answer, st.Output.Incomplete, st.Output.Stopped = resp.Text, resp.Incomplete, stopped
			return st.Output, nil
		}
		log.Info("the model called tools", "turn", turn, "calls", len(calls))
		results, err := runTools(ctx, calls)
		if err != nil {
			return st.Output, err
		}
		st.Conversation = append(st.Conversation, assistantMessage(resp))
		for i, c := range calls {
			st.Conversation = append(st.Conversation, providers.Message{Role: "tool", ToolCallID: c.ID, Content: jsonString(results[i])})
			st.Output.Tools = append(st.Output.Tools, ToolRun{Turn: turn, ID: c.ID, Name: c.Function.Name})
		}
	}
}

// ask makes turn's call, racing it against a stop signal: a stop cancels
// the call, whose end (canceled, or its answer if that came first) ask
// then returns, with stopped set.
func ask(ctx workflow.Context, in Input, st *State, turn int, stop workflow.ReceiveChannel) (res workflows.ActionResult, stopped bool, err error) {
	routes := in.Routes
	if len(routes) == 0 {
		routes = []string{"demo-primary", "demo-fallback"}
	}
	cctx, stopCall := workflow.WithCancel(ctx)
	defer stopCall()
	f := step.StartCall(cctx, CallName(turn), workflows.ActionInput{
		Request: providers.Request{Messages: st.Conversation, Tools: Tools, Stream: in.Stream},
		Routes:  routes,
	}, step.TaskQueue(in.DurallmTaskQueue))
	sel := workflow.NewSelector(ctx)
	sel.AddFuture(f.Ready(), func(r workflow.Future) { err = r.Get(ctx, &res) })
	sel.AddReceive(stop, func(c workflow.ReceiveChannel, _ bool) {
		c.Receive(ctx, nil)
		stopped = true
		stopCall()
		res, err = f.Get(ctx)
	})
	sel.Select(ctx)
	// Read once the call has started: a new workflow under a closed
	// one's id makes its call under an id of its own (step.ActionID).
	st.Output.Actions = append(st.Output.Actions, f.ActionID())
	return res, stopped, err
}

// isOurCancel reports whether err is the call's end after the agent
// canceled it.
func isOurCancel(err error) bool {
	var ae *durallm.ActionError
	return errors.As(err, &ae) && ae.Origin == workflows.OriginParentCanceled
}

// activityOptions are the tools' and ReadResponse's.
var activityOptions = workflow.ActivityOptions{
	StartToCloseTimeout: 30 * time.Second,
	RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
}

// response is the call's answer. An answer too large for history (over
// 256 KiB, by default) comes back stored by reference, with no Response:
// it is read in an activity, since workflow code cannot read the store.
func response(ctx workflow.Context, res workflows.ActionResult) (providers.Response, error) {
	if res.Response != nil {
		return *res.Response, nil
	}
	if res.ResultRef == "" {
		return providers.Response{}, temporal.NewNonRetryableApplicationError("the call "+res.ActionRef+" completed with no answer", "NoAnswer", nil)
	}
	var a *Activities
	var r providers.Response
	err := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, activityOptions), a.ReadResponse, res.ResultRef).Get(ctx, &r)
	return r, err
}

// runTools runs every call at once, each its tool's activity, and returns
// their results in the order of the calls. A tool that fails, or that
// does not exist, is an answer for the model too ("error: ..."), which
// may try otherwise.
func runTools(ctx workflow.Context, calls []ToolCall) ([]string, error) {
	actx := workflow.WithActivityOptions(ctx, activityOptions)
	futures := make([]workflow.Future, len(calls))
	for i, c := range calls {
		if tool := toolActivity(c.Function.Name); tool != nil {
			futures[i] = workflow.ExecuteActivity(actx, tool, c.Function.Arguments)
		}
	}
	results := make([]string, len(calls))
	for i, f := range futures {
		if f == nil {
			results[i] = "error: there is no tool of that name"
			continue
		}
		var out string
		err := f.Get(ctx, &out)
		var canceled *temporal.CanceledError
		var app *temporal.ApplicationError
		switch {
		case errors.As(err, &canceled):
			return nil, err
		case errors.As(err, &app):
			out = "error: " + app.Message()
		case err != nil:
			out = "error: the tool did not answer"
		}
		results[i] = out
	}
	return results, nil
}

// assistantMessage is the model's answer as the conversation keeps it:
// its text, if any, and every tool call it made, verbatim.
func assistantMessage(r providers.Response) providers.Message {
	m := providers.Message{Role: "assistant", ToolCalls: r.ToolCalls}
	if r.Text != "" || len(r.ToolCalls) == 0 {
		m.Content = jsonString(r.Text)
	}
	return m
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

func orDefault(n, def int) int {
	if n > 0 {
		return n
	}
	return def
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
