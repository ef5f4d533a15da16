package actiontest_test

import (
	"strings"
	"testing"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/actiontest"
	"github.com/durallm/durallm/workflows"
)

// hi is a small call's input.
var hi = workflows.ActionInput{Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}}, Routes: []string{"a"}}

// answer is a parent that calls name once and returns the answer's text.
func answer(name string) func(ctx workflow.Context) (string, error) {
	return func(ctx workflow.Context) (string, error) {
		res, err := step.Call(ctx, name, hi)
		if err != nil || res.Response == nil {
			return "", err
		}
		return res.Response.Text, nil
	}
}

// A call whose action id is hashed (its parent's id is long) is scripted,
// asserted and reported by the name the parent gave it.
func TestACallUnderAHashedActionIDIsScriptedByItsName(t *testing.T) {
	env := newEnv(t)
	long := strings.Repeat("p", 300)
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: long})
	if id := step.ActionID(long, "ask"); !strings.Contains(id, "~") {
		t.Fatalf("the action id %q is not hashed", id)
	}
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Answer("by name"))
	env.ExecuteWorkflow(answer("ask"))
	var text string
	if err := env.GetWorkflowResult(&text); err != nil || text != "by name" {
		t.Fatalf("got %q, %v", text, err)
	}
	if sent := actions.Sent("ask"); len(sent) != 1 || sent[0].ActionRef != step.ActionID(long, "ask") {
		t.Fatalf("sent %+v", sent)
	}
	actions.AssertExpectations(t)
}
