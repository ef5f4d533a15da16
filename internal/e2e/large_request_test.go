package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/proto"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/gateway"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// Requests by reference, on the embedded server: every process (the
// durallm worker, the Go client, the gateway, the user's own worker whose
// workflow calls step) dialed with durallm.DataConverter over one result
// store, as `durallm dev` wires them.

// refStack is a stack whose every Temporal client stores payloads by
// reference, with a gateway and a worker of the user's own for parents.
type refStack struct {
	*stack
	store   resultstore.Dir
	gw      *httptest.Server
	parents string
	// bodies are the request bodies the provider received, by action id
	// (the idempotency key).
	mu     sync.Mutex
	bodies map[string][]byte
	// answers are the provider's answers by action id; "read it all"
	// when there is none.
	answers map[string]string
}

func newRefStack(t *testing.T) *refStack {
	t.Helper()
	s := &refStack{stack: newStack(t), store: resultstore.Dir{Path: filepath.Join(t.TempDir(), "results")}, bodies: map[string][]byte{}, answers: map[string]string{}}
	dc := durallm.DataConverter(s.store)
	s.tc = s.ts.NewClientWithOptions(client.Options{DataConverter: dc})
	s.c = durallm.NewClient(s.tc, s.tq).WithResults(s.store).WithDataConverter(dc)
	s.startWorker(func(o *worker.Options) { o.Results = s.store })
	s.p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.bodies[r.IdempotencyKey] = r.Body
		if a, ok := s.answers[r.IdempotencyKey]; ok {
			return providertest.Answer(a), true
		}
		return providertest.Answer("read it all"), true
	})
	g, err := gateway.New(gateway.Options{Client: s.c, Secret: []byte(strings.Repeat("k", 32)), Logger: slog.New(slog.DiscardHandler),
		Models: gateway.Config{Models: []gateway.Model{{Name: "demo", Routes: []string{"primary", "fallback"}}}},
		// Past the store's limit (32 MiB), so that the store's own limit
		// is what refuses a request between the two.
		MaxBody: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s.gw = httptest.NewServer(g)
	t.Cleanup(s.gw.Close)
	s.parents = s.tq + "-parents"
	// The parent builds requests of up to 200 MB in workflow code, which
	// takes seconds on a busy machine: more than the SDK's deadlock
	// detector allows by default.
	w := sdkworker.New(s.tc, s.parents, sdkworker.Options{DeadlockDetectionTimeout: time.Minute})
	w.RegisterWorkflow(largeCall)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return s
}

// content is n bytes of user text that JSON escapes in several ways, the
// same for the same n.
func content(n int) string {
	const phrase = `Ünïcødé "quoted" <tag> & a\path ` + "\n\t"
	s := strings.Repeat(phrase, n/len(phrase)+1)[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1] // never cut a rune
	}
	return s + strings.Repeat("x", n-len(s))
}

func largeInput(n int) workflows.ActionInput {
	return workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", content(n))}},
		Routes:  []string{"primary", "fallback"},
	}
}

// largeCallIn and largeCallOut are the user's parent workflow's.
type largeCallIn struct {
	Size  int    `json:"size"`
	Queue string `json:"queue"`
}

type largeCallOut struct {
	Text     string `json:"text"`
	Err      string `json:"err,omitempty"`
	Invalid  bool   `json:"invalid,omitempty"`
	TooLarge bool   `json:"too_large,omitempty"`
}

// largeCall is a user's workflow making one call of in.Size bytes.
func largeCall(ctx workflow.Context, in largeCallIn) (largeCallOut, error) {
	res, err := step.Call(ctx, "call", largeInput(in.Size), step.TaskQueue(in.Queue))
	var out largeCallOut
	if err != nil {
		out.Err, out.Invalid, out.TooLarge = err.Error(), errors.Is(err, durallm.ErrInvalidInput), errors.Is(err, resultstore.ErrTooLarge)
		return out, nil
	}
	if res.Response != nil {
		out.Text = res.Response.Text
	}
	return out, nil
}

// historyBytes is the size of a workflow's history, event by event as
// Temporal stores them, and its largest event.
func historyBytes(t testing.TB, tc client.Client, id string) (total, largest int, events []*historypb.HistoryEvent) {
	t.Helper()
	iter := tc.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			t.Fatal(err)
		}
		n := proto.Size(ev)
		total += n
		largest = max(largest, n)
		events = append(events, ev)
	}
	return total, largest, events
}

// exactRequest fails the test unless the provider received, for action
// id, the user's text of n bytes, byte for byte.
func (s *refStack) exactRequest(id string, n int) {
	s.t.Helper()
	s.mu.Lock()
	body := s.bodies[id]
	s.mu.Unlock()
	var req struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) != 1 {
		s.t.Fatalf("%s: the provider received %d bytes: %v", id, len(body), err)
	}
	if req.Messages[0].Content != content(n) {
		s.t.Fatalf("%s: the provider received %d bytes of text, want the %d sent", id, len(req.Messages[0].Content), n)
	}
}

// referencesOnly fails the test unless workflow id's history is small
// and every payload it holds over claimcheck's threshold is a reference.
func (s *refStack) referencesOnly(id string) int {
	s.t.Helper()
	total, largest, events := historyBytes(s.t, s.tc, id)
	if total > 64<<10 || largest > 8<<10 {
		s.t.Fatalf("%s: history of %d bytes, largest event %d: the request went into history", id, total, largest)
	}
	refs := 0
	for _, ev := range events {
		b, _ := proto.Marshal(ev)
		refs += bytes.Count(b, []byte(claimcheck.EncodingReference))
	}
	if refs == 0 {
		s.t.Fatalf("%s: no reference in its history", id)
	}
	return total
}

var largeSizes = []struct {
	name string
	n    int
}{{"1KB", 1 << 10}, {"1MB", 1 << 20}, {"5MB", 5 << 20}, {"20MB", 20 << 20}}

// Requests of 1 KB to 20 MB complete through the Go client, step and the
// gateway: the provider receives each exactly, and the action's history
// (and the calling workflow's) holds references, not the request.
func TestE2ELargeRequestsCompleteThroughTheClientStepAndTheGateway(t *testing.T) {
	s := newRefStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	oai := openai.NewClient(option.WithBaseURL(s.gw.URL+"/v1"), option.WithAPIKey("unused"))
	for _, size := range largeSizes {
		t.Run(size.name, func(t *testing.T) {
			id := "client-" + size.name
			a, err := s.c.Start(ctx, id, largeInput(size.n))
			if err != nil {
				t.Fatal(err)
			}
			res, err := a.Result(ctx)
			if err != nil || res.Response == nil || res.Response.Text != "read it all" {
				t.Fatalf("client: %+v %v", res.Status, err)
			}
			s.exactRequest(id, size.n)

			parent := "parent-" + size.name
			run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: parent, TaskQueue: s.parents}, largeCall, largeCallIn{Size: size.n, Queue: s.tq})
			if err != nil {
				t.Fatal(err)
			}
			var out largeCallOut
			if err := run.Get(ctx, &out); err != nil || out.Text != "read it all" {
				t.Fatalf("step: %+v %v", out, err)
			}
			s.exactRequest(step.ActionID(parent, "call"), size.n)

			resp, err := oai.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:    "demo",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content(size.n))},
			})
			if err != nil || len(resp.Choices) != 1 || resp.Choices[0].Message.Content != "read it all" {
				t.Fatalf("gateway: %v", err)
			}
			s.exactRequest(resp.ID, size.n)

			if size.n < claimcheck.DefaultThreshold {
				return
			}
			for _, id := range []string{id, parent, step.ActionID(parent, "call"), resp.ID} {
				s.referencesOnly(id)
			}
		})
	}
}

// countingBody is a request body of n bytes of JSON that is made as it
// is read, counting what was read.
type countingBody struct {
	r    io.Reader
	read int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += int64(n)
	return n, err
}

// hugeChatBody is a chat request whose one message is n bytes, made as it
// is read.
func hugeChatBody(n int64) (*countingBody, int64) {
	head := `{"model":"demo","messages":[{"role":"user","content":"`
	tail := `"}]}`
	body := io.MultiReader(strings.NewReader(head), io.LimitReader(repeatReader('x'), n), strings.NewReader(tail))
	return &countingBody{r: body}, int64(len(head)) + n + int64(len(tail))
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

// A request larger than the result store keeps (40 MB) or than the
// gateway reads (200 MB) is one error whatever the size and the way in,
// an invalid input (HTTP 413 request_too_large), and nothing is started.
func TestE2EARequestLargerThanTheStoreKeepsIsRefusedAndStartsNothing(t *testing.T) {
	s := newRefStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range []int{40 << 20, 200 << 20} {
		name := fmt.Sprintf("%dMB", n>>20)
		id := "client-" + name
		if _, err := s.c.Start(ctx, id, largeInput(n)); !errors.Is(err, durallm.ErrInvalidInput) || !errors.Is(err, resultstore.ErrTooLarge) {
			t.Fatalf("client, %s: %v", name, err)
		}
		if _, err := s.c.Describe(ctx, id); !errors.Is(err, durallm.ErrNotFound) {
			t.Fatalf("client, %s: the action exists: %v", name, err)
		}

		parent := "parent-" + name
		run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: parent, TaskQueue: s.parents}, largeCall, largeCallIn{Size: n, Queue: s.tq})
		if err != nil {
			t.Fatal(err)
		}
		var out largeCallOut
		if err := run.Get(ctx, &out); err != nil || !out.Invalid || !out.TooLarge {
			t.Fatalf("step, %s: %+v %v", name, out, err)
		}
		if _, err := s.c.Describe(ctx, step.ActionID(parent, "call")); !errors.Is(err, durallm.ErrNotFound) {
			t.Fatalf("step, %s: the action exists: %v", name, err)
		}
		if _, _, events := historyBytes(t, s.tc, parent); hasEvent(events, enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED) {
			t.Fatalf("step, %s: the parent started a child", name)
		}

		body, length := hugeChatBody(int64(n))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.gw.URL+"/v1/chat/completions", body)
		req.ContentLength = length
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("gateway, %s: %v", name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusRequestEntityTooLarge || json.Unmarshal(b, &e) != nil || e.Error.Code != "request_too_large" {
			t.Fatalf("gateway, %s: %d %s", name, resp.StatusCode, b)
		}
		if n > 64<<20 && body.read > 64<<20 {
			t.Fatalf("gateway, %s: %d bytes were sent of a body over its bound", name, body.read)
		}
	}
	if got := len(s.p.Received()); got != 0 {
		t.Fatalf("the provider received %d requests", got)
	}
	if ids, err := s.c.List(ctx, workflows.StateCompleted, 10); err != nil || len(ids) != 0 {
		t.Fatalf("actions listed: %v %v", ids, err)
	}
}

func hasEvent(events []*historypb.HistoryEvent, t enumspb.EventType) bool {
	for _, ev := range events {
		if ev.GetEventType() == t {
			return true
		}
	}
	return false
}

// A call over Temporal's payload limit from a worker of the user's own
// dialed without durallm.DataConverter is the call's error: the parent
// ends, where the SDK would fail its workflow task for ever
// (PayloadsTooLarge) and the call would never return. A call within the
// limit works as before, its answer (over 2 KiB) in the parent's history,
// which that worker reads.
func TestE2EALargeCallFromAWorkerWithoutTheConverterIsAnErrorNotATaskFailingForEver(t *testing.T) {
	s := newRefStack(t)
	plain := s.ts.NewClientWithOptions(client.Options{})
	q := s.tq + "-plain-parents"
	w := sdkworker.New(plain, q, sdkworker.Options{DeadlockDetectionTimeout: time.Minute})
	w.RegisterWorkflow(largeCall)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	long := strings.Repeat("a long answer ", 1000)
	s.mu.Lock()
	s.answers[step.ActionID("plain-small", "call")] = long
	s.mu.Unlock()
	small, err := plain.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "plain-small", TaskQueue: q}, largeCall, largeCallIn{Size: 100 << 10, Queue: s.tq})
	if err != nil {
		t.Fatal(err)
	}
	var got largeCallOut
	if err := small.Get(ctx, &got); err != nil || got.Text != long {
		t.Fatalf("a call within the limit: %d bytes, %q %v", len(got.Text), got.Err, err)
	}
	run, err := plain.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "plain-parent", TaskQueue: q}, largeCall, largeCallIn{Size: 3 << 20, Queue: s.tq})
	if err != nil {
		t.Fatal(err)
	}
	var out largeCallOut
	if err := run.Get(ctx, &out); err != nil || !out.Invalid || !strings.Contains(out.Err, "durallm.DataConverter") {
		t.Fatalf("parent: %+v %v", out, err)
	}
	if got := len(s.p.Received()); got != 1 {
		t.Fatalf("the provider received %d requests, want the small call's one", got)
	}
}
