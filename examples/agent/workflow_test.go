package agent_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/suite"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/examples/agent"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/actiontest"
	"github.com/durallm/durallm/workflows"
)

// The agent's unit tests, in virtual time, with its LLM calls scripted by
// durallm's testsuite/actiontest: no worker, no provider, no model.
type AgentSuite struct {
	suite.Suite
	testsuite.WorkflowTestSuite
	env     *testsuite.TestWorkflowEnvironment
	actions *actiontest.Actions
}

func TestAgent(t *testing.T) { suite.Run(t, new(AgentSuite)) }

func (s *AgentSuite) SetupTest() {
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	s.env = s.NewTestWorkflowEnvironment()
	s.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "agent-1"})
	s.actions = actiontest.Register(s.T(), s.env)
	// The store the scripted actions keep answers by reference in, as a
	// worker's Activities get the durallm workers' store.
	s.env.RegisterActivity(&agent.Activities{Results: s.actions.Results()})
}

func (s *AgentSuite) run(in agent.Input) (agent.Output, error) {
	s.env.ExecuteWorkflow(agent.Agent, in)
	s.True(s.env.IsWorkflowCompleted())
	var out agent.Output
	if err := s.env.GetWorkflowError(); err != nil {
		return out, err
	}
	s.NoError(s.env.GetWorkflowResult(&out))
	return out, nil
}

// turn is the call name of turn n.
func turn(n int) string { return agent.CallName(n) }

// call is one tool call: a tool's name and its arguments.
type call struct{ name, args string }

func lookup(id string) call { return call{"lookup_order", `{"order_id":"` + id + `"}`} }

// calling is a response making calls, numbered call_1, call_2, ...
func calling(calls ...call) providers.Response {
	var list []map[string]any
	for i, c := range calls {
		list = append(list, map[string]any{"id": "call_" + strconv.Itoa(i+1), "type": "function", "function": map[string]string{"name": c.name, "arguments": c.args}})
	}
	b, _ := json.Marshal(list)
	return providers.Response{ToolCalls: b}
}

// toolCalls is a response calling lookup_order once per order id.
func toolCalls(ids ...string) providers.Response {
	var calls []call
	for _, id := range ids {
		calls = append(calls, lookup(id))
	}
	return calling(calls...)
}

// toolMessages are the tool messages of msgs, as (call id, content).
func toolMessages(msgs []providers.Message) [][2]string {
	var out [][2]string
	for _, m := range msgs {
		if m.Role == "tool" {
			var text string
			_ = json.Unmarshal(m.Content, &text)
			out = append(out, [2]string{m.ToolCallID, text})
		}
	}
	return out
}

func (s *AgentSuite) TestAsksRunsTheToolAndAsksAgain() {
	s.actions.On(turn(1), actiontest.Respond(toolCalls("42")))
	s.actions.On(turn(2), actiontest.Answer("Order 42 arrives Thursday."))
	out, err := s.run(agent.Input{Question: "Where is order 42?"})
	s.Require().NoError(err)
	s.Equal("Order 42 arrives Thursday.", out.Answer)
	s.Equal([]agent.ToolRun{{Turn: 1, ID: "call_1", Name: "lookup_order"}}, out.Tools)
	s.Equal([]string{"agent-1-turn-1", "agent-1-turn-2"}, out.Actions)
	s.Equal(2, out.Turns)
	s.Equal([][2]string{{"call_1", "order 42: shipped on Monday, arriving Thursday"}}, toolMessages(s.actions.Request(turn(2)).Messages))
	s.actions.AssertExpectations(s.T())
}

func (s *AgentSuite) TestAnAnswerWithoutAToolCallEndsTheAgent() {
	s.actions.On(turn(1), actiontest.Answer("I need an order id."))
	out, err := s.run(agent.Input{Question: "Where is my order?"})
	s.Require().NoError(err)
	s.Equal("I need an order id.", out.Answer)
	s.Empty(out.Tools)
	s.Len(out.Actions, 1)
}

// An answer a worker stored by reference (every durallm worker does so
// above 256 KiB) has no Response: the agent resolves it, and never
// dereferences the nil Response, which would panic and block its
// workflow task.
func (s *AgentSuite) TestAnAnswerByReferenceIsResolvedNotDereferencedAsANilResponse() {
	s.actions.On(turn(1), actiontest.Answer("I need an order id.").ByReference())
	out, err := s.run(agent.Input{Question: "Where is my order?"})
	s.Require().NoError(err)
	s.Equal("I need an order id.", out.Answer)
}

// Tool calls stored by reference are resolved and run like any others.
func (s *AgentSuite) TestToolCallsByReferenceAreRun() {
	s.actions.On(turn(1), actiontest.Respond(toolCalls("42")).ByReference())
	s.actions.On(turn(2), actiontest.Answer("Thursday."))
	out, err := s.run(agent.Input{Question: "Where is order 42?"})
	s.Require().NoError(err)
	s.Equal("Thursday.", out.Answer)
	s.Len(toolMessages(s.actions.Request(turn(2)).Messages), 1)
}

// A turn with several tool calls answers every one: one tool message per
// call id, in the order of the calls, after the assistant message that
// made them. A provider rejects (400) a conversation with a call left
// unanswered.
func (s *AgentSuite) TestEveryToolCallOfATurnIsAnsweredOncePerCallID() {
	s.actions.On(turn(1), actiontest.Respond(toolCalls("42", "7")))
	s.actions.On(turn(2), actiontest.Answer("42 arrives Thursday; 7 is unknown."))
	_, err := s.run(agent.Input{Question: "Where are orders 42 and 7?"})
	s.Require().NoError(err)
	msgs := s.actions.Request(turn(2)).Messages
	s.Require().Len(msgs, 5)
	s.Equal("assistant", msgs[2].Role)
	s.JSONEq(string(toolCalls("42", "7").ToolCalls), string(msgs[2].ToolCalls))
	s.Empty(msgs[2].Content, "a tool-calling answer with no text has no content")
	s.Equal([][2]string{
		{"call_1", "order 42: shipped on Monday, arriving Thursday"},
		{"call_2", "order 7: not found"},
	}, toolMessages(msgs[3:]))
}

// The tools of a turn run at once: two tools of a minute each take a
// minute.
func (s *AgentSuite) TestTheToolsOfATurnRunInParallel() {
	var a *agent.Activities
	s.env.OnActivity(a.LookupOrder, mock.Anything, mock.Anything).After(time.Minute).Return("found", nil)
	s.actions.On(turn(1), actiontest.Respond(toolCalls("42", "7")))
	s.actions.On(turn(2), actiontest.Answer("Both found."))
	start := s.env.Now()
	_, err := s.run(agent.Input{Question: "Where are orders 42 and 7?"})
	s.Require().NoError(err)
	s.Less(s.env.Now().Sub(start), 90*time.Second)
	s.Equal([][2]string{{"call_1", "found"}, {"call_2", "found"}}, toolMessages(s.actions.Request(turn(2)).Messages))
}

// A tool that fails, or that does not exist, is an answer for the model,
// which may try otherwise: the agent goes on.
func (s *AgentSuite) TestAFailedOrUnknownToolIsAnAnswerForTheModel() {
	s.actions.On(turn(1), actiontest.Respond(calling(call{"lookup_order", `{"id":42}`}, call{"cancel_order", `{"order_id":"42"}`})))
	s.actions.On(turn(2), actiontest.Answer("I cannot do that."))
	out, err := s.run(agent.Input{Question: "Cancel order 42."})
	s.Require().NoError(err)
	s.Equal("I cannot do that.", out.Answer)
	s.Equal([][2]string{
		{"call_1", `error: lookup_order: arguments must be {"order_id": "..."}`},
		{"call_2", "error: there is no tool of that name"},
	}, toolMessages(s.actions.Request(turn(2)).Messages))
}

// The agent calls the model again after each turn of tool calls, until
// an answer calls none.
func (s *AgentSuite) TestTheAgentLoopsUntilTheModelStopsCallingTools() {
	s.actions.On(turn(1), actiontest.Respond(toolCalls("42")))
	s.actions.On(turn(2), actiontest.Respond(toolCalls("7")))
	s.actions.On(turn(3), actiontest.Answer("42 arrives Thursday; 7 is unknown."))
	out, err := s.run(agent.Input{Question: "Where are orders 42 and 7?"})
	s.Require().NoError(err)
	s.Equal("42 arrives Thursday; 7 is unknown.", out.Answer)
	s.Len(out.Actions, 3)
	// Each turn sends the whole conversation: turn 3 both answers.
	s.Len(toolMessages(s.actions.Request(turn(3)).Messages), 2)
	s.actions.AssertExpectations(s.T())
}

// A model that never stops calling tools fails the agent at MaxTurns.
func (s *AgentSuite) TestAModelThatNeverStopsCallingToolsFailsAtMaxTurns() {
	s.actions.On(turn(1), actiontest.Respond(toolCalls("42")))
	s.actions.On(turn(2), actiontest.Respond(toolCalls("42")))
	_, err := s.run(agent.Input{Question: "?", MaxTurns: 2})
	var app *temporal.ApplicationError
	s.Require().True(errors.As(err, &app), "error %v", err)
	s.Equal("TooManyTurns", app.Type())
	s.True(app.NonRetryable())
}

// After TurnsPerRun turns the agent continues as new, carrying its
// conversation and its turn count: the next run's first call is the
// next turn's, never a name made before (which would get that call's
// answer again).
func (s *AgentSuite) TestTheAgentContinuesAsNewCarryingItsTurnCount() {
	s.actions.On(turn(1), actiontest.Respond(toolCalls("42")))
	s.actions.On(turn(2), actiontest.Respond(toolCalls("7")))
	_, err := s.run(agent.Input{Question: "Where are orders 42 and 7?", TurnsPerRun: 2})
	var can *workflow.ContinueAsNewError
	s.Require().True(errors.As(err, &can), "error %v", err)
	var next agent.Input
	s.Require().NoError(converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	s.Require().NotNil(next.State)
	s.Equal(2, next.State.Turn)
	s.Equal(2, next.TurnsPerRun)
	s.Len(next.State.Conversation, 6) // system, user, and per turn the answer and its tool's result
	s.Equal([]string{"agent-1-turn-1", "agent-1-turn-2"}, next.State.Output.Actions)

	// The next run, in an environment of its own, as Temporal runs it
	// under the same workflow id.
	env := s.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "agent-1"})
	actions := actiontest.Register(s.T(), env)
	env.RegisterActivity(&agent.Activities{Results: actions.Results()})
	actions.On(turn(3), actiontest.Answer("42 arrives Thursday; 7 is unknown."))
	env.ExecuteWorkflow(agent.Agent, next)
	var out agent.Output
	s.Require().NoError(env.GetWorkflowResult(&out))
	s.Equal("42 arrives Thursday; 7 is unknown.", out.Answer)
	s.Equal(3, out.Turns)
	s.Equal([]string{"agent-1-turn-1", "agent-1-turn-2", "agent-1-turn-3"}, out.Actions)
	s.Len(out.Tools, 2)
	s.Len(toolMessages(actions.Request(turn(3)).Messages), 2)
}

// A stop signal races the call in flight: the call is canceled
// (parent_canceled, its attempt settled with its evidence) and the agent
// ends, stopped.
func (s *AgentSuite) TestAStopSignalCancelsTheCallInFlight() {
	s.actions.On(turn(1), actiontest.Hold())
	var call workflows.ActionResult
	s.env.SetOnChildWorkflowCompletedListener(func(info *workflow.Info, res converter.EncodedValue, err error) {
		if info.WorkflowExecution.ID == "agent-1-turn-1" && err == nil {
			s.NoError(res.Get(&call))
		}
	})
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(agent.SignalStop, nil) }, 5*time.Second)
	out, err := s.run(agent.Input{Question: "Where is order 42?"})
	s.Require().NoError(err)
	s.True(out.Stopped)
	s.Empty(out.Answer)
	s.Equal(workflows.StateCanceled, call.State)
	s.Equal(workflows.OriginParentCanceled, call.Origin)
	s.Len(s.actions.Sent(turn(1)), 1)
}

// A stop that arrives while the tools run ends the agent before its next
// call.
func (s *AgentSuite) TestAStopDuringTheToolsEndsTheAgentBeforeItsNextCall() {
	var a *agent.Activities
	s.env.OnActivity(a.LookupOrder, mock.Anything, mock.Anything).After(time.Minute).Return("found", nil)
	s.actions.On(turn(1), actiontest.Respond(toolCalls("42")))
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(agent.SignalStop, nil) }, 30*time.Second)
	out, err := s.run(agent.Input{Question: "Where is order 42?"})
	s.Require().NoError(err)
	s.True(out.Stopped)
	s.Equal(1, out.Turns)
	s.Empty(s.actions.Sent(turn(2)))
}

// A stream cut after it began ends the agent with what arrived, and why
// it is cut.
func (s *AgentSuite) TestAStreamCutAfterItBeganEndsTheAgentWithWhatArrived() {
	s.actions.On(turn(1), actiontest.Partial("Order 42 arr"))
	out, err := s.run(agent.Input{Question: "Where is order 42?", Stream: true})
	s.Require().NoError(err)
	s.Equal("Order 42 arr", out.Answer)
	s.Equal(providers.IncompleteReset, out.Incomplete)
}

// An ambiguous first call waits for a verdict, durably, and the agent
// goes on once not_executed arrives: the request is sent again only then.
func (s *AgentSuite) TestAnAmbiguousCallWaitsForItsVerdict() {
	s.actions.On(turn(1), actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 2*time.Minute), actiontest.Respond(toolCalls("42")))
	s.actions.On(turn(2), actiontest.Refused(), actiontest.Answer("Thursday."))
	out, err := s.run(agent.Input{Question: "Where is order 42?"})
	s.Require().NoError(err)
	s.Equal("Thursday.", out.Answer)
	s.actions.AssertExpectations(s.T())
}

// A rejected request fails the agent with an error that says so, not
// retried.
func (s *AgentSuite) TestARejectedCallFailsTheAgentWithoutRetry() {
	s.actions.On(turn(1), actiontest.Rejected(400))
	_, err := s.run(agent.Input{Question: "?"})
	var app *temporal.ApplicationError
	s.Require().True(errors.As(err, &app), "error %v", err)
	s.Equal("ModelRejected", app.Type())
	s.True(app.NonRetryable())
}

// The agent canceled by its caller cancels the call it is waiting for
// (parent_canceled: no fallback, health untouched) and ends canceled
// itself.
func (s *AgentSuite) TestACanceledAgentCancelsItsCall() {
	s.actions.On(turn(1), actiontest.Hold())
	s.env.RegisterDelayedCallback(s.env.CancelWorkflow, 5*time.Second)
	_, err := s.run(agent.Input{Question: "Where is order 42?"})
	var canceled *temporal.CanceledError
	s.True(errors.As(err, &canceled), "error %v", err)
}
