package agent_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/suite"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/examples/agent"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/actiontest"
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
	s.env = s.NewTestWorkflowEnvironment()
	s.env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "agent-1"})
	s.env.RegisterActivity(&agent.Activities{})
	s.actions = actiontest.Register(s.T(), s.env)
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

// lookup is a response that calls lookup_order for id.
func lookup(id string) providers.Response {
	args, _ := json.Marshal(map[string]string{"order_id": id})
	calls, _ := json.Marshal([]map[string]any{{"id": "call_1", "type": "function", "function": map[string]string{"name": "lookup_order", "arguments": string(args)}}})
	return providers.Response{ToolCalls: calls}
}

func (s *AgentSuite) TestAsksRunsTheToolAndAsksAgain() {
	s.actions.On(agent.CallAsk, actiontest.Respond(lookup("42")))
	s.actions.On(agent.CallAnswer, actiontest.Answer("Order 42 arrives Thursday."))
	out, err := s.run(agent.Input{Question: "Where is order 42?"})
	s.NoError(err)
	s.Equal("Order 42 arrives Thursday.", out.Answer)
	s.Equal("lookup_order", out.Tool)
	s.Equal("order 42: shipped on Monday, arriving Thursday", out.ToolResult)
	s.Equal([]string{"agent-1-ask", "agent-1-answer"}, out.Actions)
}

func (s *AgentSuite) TestAnAnswerWithoutAToolCallEndsTheAgent() {
	s.actions.On(agent.CallAsk, actiontest.Answer("I need an order id."))
	out, err := s.run(agent.Input{Question: "Where is my order?"})
	s.NoError(err)
	s.Equal("I need an order id.", out.Answer)
	s.Empty(out.Tool)
	s.Len(out.Actions, 1)
}

// An ambiguous first call waits for a verdict, durably, and the agent
// goes on once not_executed arrives: the request is sent again only then.
func (s *AgentSuite) TestAnAmbiguousCallWaitsForItsVerdict() {
	s.actions.On(agent.CallAsk, actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, 2*time.Minute), actiontest.Respond(lookup("42")))
	s.actions.On(agent.CallAnswer, actiontest.Refused(), actiontest.Answer("Thursday."))
	out, err := s.run(agent.Input{Question: "Where is order 42?"})
	s.NoError(err)
	s.Equal("Thursday.", out.Answer)
}

// A rejected request fails the agent with an error that says so, not
// retried.
func (s *AgentSuite) TestARejectedCallFailsTheAgentWithoutRetry() {
	s.actions.On(agent.CallAsk, actiontest.Rejected(400))
	_, err := s.run(agent.Input{Question: "?"})
	var app *temporal.ApplicationError
	s.True(errors.As(err, &app), "error %v", err)
	s.Equal("ModelRejected", app.Type())
	s.True(app.NonRetryable())
}

// The agent canceled by its caller cancels the call it is waiting for
// (parent_canceled: no fallback, health untouched) and ends canceled
// itself.
func (s *AgentSuite) TestACanceledAgentCancelsItsCall() {
	s.actions.On(agent.CallAsk, actiontest.Hold())
	s.env.RegisterDelayedCallback(s.env.CancelWorkflow, 5*time.Second)
	_, err := s.run(agent.Input{Question: "Where is order 42?"})
	var canceled *temporal.CanceledError
	s.True(errors.As(err, &canceled), "error %v", err)
}
