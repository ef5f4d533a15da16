package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/proto"

	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/examples/agent"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/providertest"
)

// The example agent (examples/agent) on the embedded server, against a
// model scripted turn by turn: the provider answers each turn's call by
// its action id (the idempotency key), with tool calls or text, and
// rejects (400, as OpenAI does) a conversation in which a tool call was
// left unanswered.

// toolCall is one call a scripted model makes.
type toolCall struct{ name, args string }

// modelTurn is what the scripted model answers one turn: tool calls, or
// text when there are none.
type modelTurn struct {
	calls []toolCall
	text  string
}

// scriptedModel answers each turn of the agent with workflow id
// agentID as turns says (turn n is turns[n-1]), and records what it was
// asked.
type scriptedModel struct {
	agentID string
	turns   []modelTurn

	mu     sync.Mutex
	bodies map[int][]byte   // the request of each turn
	bad    map[int][]string // the unanswered call ids each turn sent
}

func newScriptedModel(agentID string, turns []modelTurn) *scriptedModel {
	return &scriptedModel{agentID: agentID, turns: turns, bodies: map[int][]byte{}, bad: map[int][]string{}}
}

// behave is the provider's script.
func (m *scriptedModel) behave(r providertest.Request) (providertest.Behavior, bool) {
	n := 0
	for i := range m.turns {
		if r.IdempotencyKey == step.ActionID(m.agentID, agent.CallName(i+1)) {
			n = i + 1
		}
	}
	if n == 0 {
		return providertest.Behavior{}, false
	}
	unanswered := unansweredCalls(r.Body)
	m.mu.Lock()
	m.bodies[n] = r.Body
	if len(unanswered) > 0 {
		m.bad[n] = unanswered
	}
	m.mu.Unlock()
	if len(unanswered) > 0 {
		return providertest.Status(400, nil, fmt.Sprintf(`{"error":{"type":"invalid_request_error","message":"An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: %s"}}`, strings.Join(unanswered, ", "))), true
	}
	t := m.turns[n-1]
	if len(t.calls) == 0 {
		return providertest.Answer(t.text), true
	}
	var calls []map[string]any
	for i, c := range t.calls {
		calls = append(calls, map[string]any{"id": fmt.Sprintf("call_%d_%d", n, i+1), "type": "function",
			"function": map[string]string{"name": c.name, "arguments": c.args}})
	}
	body, _ := json.Marshal(map[string]any{
		"id": fmt.Sprintf("chatcmpl-turn-%d", n), "object": "chat.completion", "created": 1, "model": "scripted",
		"choices": []any{map[string]any{"index": 0, "finish_reason": "tool_calls", "message": map[string]any{"role": "assistant", "tool_calls": calls}}},
		"usage":   map[string]int{"prompt_tokens": len(r.Body) / 4, "completion_tokens": 10, "total_tokens": len(r.Body)/4 + 10},
	})
	return providertest.Status(200, nil, string(body)), true
}

// unansweredCalls are the ids of the tool calls in a chat request's
// messages that no tool message right after their assistant message
// answers, in the order of the calls.
func unansweredCalls(body []byte) []string {
	var req struct {
		Messages []struct {
			Role       string `json:"role"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID string `json:"id"`
			} `json:"tool_calls"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return []string{"(the request is not JSON)"}
	}
	var missing []string
	for i, m := range req.Messages {
		for j, c := range m.ToolCalls {
			k := i + 1 + j
			if k >= len(req.Messages) || req.Messages[k].Role != "tool" || req.Messages[k].ToolCallID != c.ID {
				missing = append(missing, c.ID)
			}
		}
	}
	return missing
}

// check fails the test for each turn whose request left a call
// unanswered, and for each turn the provider did not execute exactly
// once.
func (m *scriptedModel) check(t *testing.T, p *providertest.Provider) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	for n, ids := range m.bad {
		t.Errorf("turn %d left tool calls unanswered: %v", n, ids)
	}
	for n := 1; n <= len(m.turns); n++ {
		if got := p.ExecutedCount(step.ActionID(m.agentID, agent.CallName(n))); got != 1 {
			t.Errorf("turn %d executed %d times", n, got)
		}
	}
}

// runs are the histories of workflow id's runs, from its first (runID)
// along its Continue-As-New chain.
func runs(t testing.TB, tc client.Client, id, runID string) [][]*historypb.HistoryEvent {
	t.Helper()
	var out [][]*historypb.HistoryEvent
	for runID != "" {
		var events []*historypb.HistoryEvent
		iter := tc.GetWorkflowHistory(context.Background(), id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		next := ""
		for iter.HasNext() {
			ev, err := iter.Next()
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, ev)
			if a := ev.GetWorkflowExecutionContinuedAsNewEventAttributes(); a != nil {
				next = a.GetNewExecutionRunId()
			}
		}
		out = append(out, events)
		runID = next
	}
	return out
}

// countEvents is how many events of type typ events holds.
func countEvents(events []*historypb.HistoryEvent, typ enumspb.EventType) int {
	n := 0
	for _, ev := range events {
		if ev.GetEventType() == typ {
			n++
		}
	}
	return n
}

// The agent answers every tool call of a turn (two at once here), loops
// until the model stops calling tools and continues as new after
// TurnsPerRun turns; every turn is executed once. Its runs' histories
// are what examples/agent's replay test replays.
func TestE2EAgentAnswersEveryToolCallAndContinuesAsNew(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	q := s.parents()
	m := newScriptedModel("agent-e2e", []modelTurn{
		{calls: []toolCall{{"lookup_order", `{"order_id":"42"}`}, {"read_document", `{"name":"returns"}`}}},
		{calls: []toolCall{{"lookup_order", `{"order_id":"7"}`}}},
		{text: "Order 42 arrives Thursday and can be returned within 30 days; order 7 is unknown."},
	})
	s.p.Script(m.behave)
	in := s.agentInput(false)
	in.Question, in.TurnsPerRun = "Where are orders 42 and 7, and can I return them?", 2
	run := s.startParent("agent-e2e", q, agent.Agent, in)
	first := run.GetRunID() // Get follows the runs: the first is known now
	out := getOutput(t, run)
	m.check(t, s.p)
	if out.Turns != 3 || len(out.Tools) != 3 || out.Tools[1].Name != "read_document" || !strings.HasPrefix(out.Answer, "Order 42 arrives Thursday") {
		t.Fatalf("output %+v", out)
	}
	histories := runs(t, s.tc, "agent-e2e", first)
	if len(histories) != 2 {
		t.Fatalf("%d runs, want 2 (one Continue-As-New)", len(histories))
	}
	for i, want := range []int{2, 1} {
		if n := countEvents(histories[i], enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED); n != want {
			t.Fatalf("run %d made %d calls, want %d", i+1, n, want)
		}
	}
	// The second run starts with turn 3's call.
	for _, ev := range histories[1] {
		if a := ev.GetStartChildWorkflowExecutionInitiatedEventAttributes(); a != nil && a.GetWorkflowId() != "agent-e2e-turn-3" {
			t.Fatalf("the second run called %s", a.GetWorkflowId())
		}
	}
	second := histories[1][0].GetWorkflowExecutionStartedEventAttributes().GetOriginalExecutionRunId()
	dir := filepath.Join("..", "..", "examples", "agent", "testdata")
	s.saveRunHistoryAt("agent-e2e", first, filepath.Join(dir, "agent_run1.json"))
	s.saveRunHistoryAt("agent-e2e", second, filepath.Join(dir, "agent_run2.json"))
}

// A 30-turn agent continuing as new every 10 turns completes, each turn
// executed once by the provider's own record, one of its turns a 20 MB
// request (a document a tool read, carried in the conversation) and its
// last answer too large for history (stored by reference by the worker,
// read back by the agent). Every process stores payloads by reference, as
// the agent's README says: each run's history holds references, not the
// conversation.
func TestE2EAThirtyTurnAgentContinuingAsNewEveryTenTurnsCompletesEachTurnOnce(t *testing.T) {
	s := newRefStack(t)
	const id, turns, docTurn = "agent-30", 30, 29
	document := prose(20 << 20)
	answer := prose(300 << 10) // over the worker's 256 KiB: by reference
	var script []modelTurn
	for n := 1; n <= turns; n++ {
		switch {
		case n == turns:
			script = append(script, modelTurn{text: answer})
		case n == docTurn-1:
			script = append(script, modelTurn{calls: []toolCall{{"read_document", `{"name":"manual"}`}}})
		case n%5 == 0:
			script = append(script, modelTurn{calls: []toolCall{{"lookup_order", fmt.Sprintf(`{"order_id":"%d"}`, n)}, {"lookup_order", `{"order_id":"42"}`}}})
		default:
			script = append(script, modelTurn{calls: []toolCall{{"lookup_order", fmt.Sprintf(`{"order_id":"%d"}`, n)}}})
		}
	}
	m := newScriptedModel(id, script)
	s.p.Script(m.behave)
	q := s.tq + "-agent"
	w := sdkworker.New(s.tc, q, sdkworker.Options{})
	w.RegisterWorkflow(agent.Agent)
	w.RegisterActivity(&agent.Activities{Results: s.store, Documents: map[string]string{"manual": document}})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	run := s.startParent(id, q, agent.Agent, agent.Input{Question: "Read the manual and check the orders.", Routes: []string{"primary", "fallback"},
		DurallmTaskQueue: s.tq, MaxTurns: turns, TurnsPerRun: 10})
	first := run.GetRunID()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out agent.Output
	if err := run.Get(ctx, &out); err != nil {
		t.Fatalf("agent: %v", err)
	}
	m.check(t, s.p)
	if n := len(s.p.Received()); n != turns {
		t.Fatalf("the provider received %d requests for %d turns", n, turns)
	}
	if out.Turns != turns || out.Answer != answer || len(out.Actions) != turns || len(out.Tools) != turns-1+5 {
		t.Fatalf("output: %d turns, %d actions, %d tools, an answer of %d bytes", out.Turns, len(out.Actions), len(out.Tools), len(out.Answer))
	}
	// The 20 MB turn sent the document whole, and so did the last.
	m.mu.Lock()
	for _, n := range []int{docTurn, turns} {
		if body := m.bodies[n]; len(body) < 20<<20 || !bytes.Contains(body, mustJSON(document)) {
			t.Errorf("turn %d sent %d bytes without the document", n, len(body))
		}
	}
	m.mu.Unlock()

	histories := runs(t, s.tc, id, first)
	if len(histories) != 3 {
		t.Fatalf("%d runs, want 3", len(histories))
	}
	for i, events := range histories {
		total, largest := 0, 0
		for _, ev := range events {
			n := proto.Size(ev)
			total, largest = total+n, max(largest, n)
		}
		calls := countEvents(events, enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED)
		t.Logf("run %d: %d calls, %d events, %d bytes of history (%d per call), largest event %d bytes", i+1, calls, len(events), total, total/max(calls, 1), largest)
		if calls != 10 {
			t.Errorf("run %d made %d calls, want 10", i+1, calls)
		}
		// References, not conversations: a turn's history is a few KB
		// whatever the conversation's size.
		if largest > 16<<10 || total > 10*8<<10 {
			t.Errorf("run %d: %d bytes of history, largest event %d: the conversation went into history", i+1, total, largest)
		}
		refs := 0
		for _, ev := range events {
			b, _ := proto.Marshal(ev)
			refs += bytes.Count(b, []byte(claimcheck.EncodingReference))
		}
		if refs == 0 {
			t.Errorf("run %d holds no reference", i+1)
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
