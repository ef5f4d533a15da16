package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// The Responses surface's stored ops with openai-go's Responses client on
// its defaults: background and retrieve, cancel, delete, input_items and
// previous_response_id, every one read from Temporal, never a gateway's
// memory.

// retrieveEnded retrieves a response until it is no longer queued or in
// progress.
func retrieveEnded(t *testing.T, c *openai.Client, id string) *responses.Response {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := c.Responses.Get(testCtx(t), id, responses.ResponseGetParams{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != responses.ResponseStatusQueued && r.Status != responses.ResponseStatusInProgress {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still %s", id, r.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statusOf is the HTTP status of an SDK error, 0 for none.
func statusOf(err error) int {
	var e *openai.Error
	if errors.As(err, &e) {
		return e.StatusCode
	}
	return 0
}

func TestResponsesBackgroundIsRetrievedLater(t *testing.T) {
	s := newGateway(t)
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("answered in the background").WaitFor(gate))
	c := s.client(tokenA)
	params := responseParams("demo", "take your time")
	params.Background = openai.Bool(true)
	r, err := c.Responses.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	// The provider has not answered: the answer is the queued response.
	if r.Status != responses.ResponseStatusQueued || r.OutputText() != "" || !strings.HasPrefix(r.ID, "gw-") {
		t.Fatalf("background answer %s", r.RawJSON())
	}
	if now, err := c.Responses.Get(testCtx(t), r.ID, responses.ResponseGetParams{}); err != nil || now.Status == responses.ResponseStatusCompleted {
		t.Fatalf("retrieve while held: %v %v", err, now)
	}
	close(gate)
	// Retrieved through a gateway started since: Temporal's, not a memory.
	got := retrieveEnded(t, s.clientAt(s.beside(besideOptions{})+"/v1", tokenA), r.ID)
	if got.Status != responses.ResponseStatusCompleted || got.OutputText() != "answered in the background" || got.ID != r.ID {
		t.Fatalf("retrieved %s", got.RawJSON())
	}
	if _, err := s.client(tokenB).Responses.Get(testCtx(t), r.ID, responses.ResponseGetParams{}); statusOf(err) != http.StatusNotFound {
		t.Fatalf("another caller's retrieve: %v, want 404", err)
	}
}

func TestResponsesCancelOfABackgroundResponseIsTheCallersStop(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Hold())
	c := s.client(tokenA)
	params := responseParams("demo", "never answered")
	params.Background = openai.Bool(true)
	r, err := c.Responses.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	s.waitState(r.ID, workflows.StateDispatching)
	if _, err := s.client(tokenB).Responses.Cancel(testCtx(t), r.ID); statusOf(err) != http.StatusNotFound {
		t.Fatalf("another caller's cancel: %v, want 404", err)
	}
	if _, err := c.Responses.Cancel(testCtx(t), r.ID); err != nil {
		t.Fatal(err)
	}
	res := s.result(r.ID)
	if res.State != workflows.StateCanceled || res.Origin != workflows.OriginUserStop {
		t.Fatalf("the action ended %s (%s), want canceled by user_stop", res.State, res.Origin)
	}
	if got := retrieveEnded(t, c, r.ID); got.Status != responses.ResponseStatusCancelled {
		t.Fatalf("retrieved after the cancel: %s", got.RawJSON())
	}
	// Cancelling again answers the response as it ended.
	if again, err := c.Responses.Cancel(testCtx(t), r.ID); err != nil || again.Status != responses.ResponseStatusCancelled {
		t.Fatalf("second cancel: %v %v", err, again)
	}
}

func TestResponsesConversationAcrossGatewayRestarts(t *testing.T) {
	s := newGateway(t)
	var mu sync.Mutex
	var bodies [][]byte
	s.p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, r.Body)
		return providertest.Behavior{}, false
	})
	s.p.Push(providertest.Answer("answer one"), providertest.Answer("answer two"), providertest.Answer("answer three"))
	// Each turn goes to a gateway started after the previous turn ended:
	// none holds anything of the conversation but what Temporal does.
	first := responseParams("demo", "turn one")
	first.Instructions = openai.String("be brief")
	r1, err := s.client(tokenA).Responses.New(testCtx(t), first)
	if err != nil {
		t.Fatal(err)
	}
	second := responseParams("demo", "turn two")
	second.PreviousResponseID = openai.String(r1.ID)
	r2, err := s.clientAt(s.beside(besideOptions{hub: true})+"/v1", tokenA).Responses.New(testCtx(t), second)
	if err != nil {
		t.Fatal(err)
	}
	third := responseParams("demo", "turn three")
	third.PreviousResponseID = openai.String(r2.ID)
	third.Instructions = openai.String("be kind")
	c3 := s.clientAt(s.beside(besideOptions{hub: true})+"/v1", tokenA)
	r3, err := c3.Responses.New(testCtx(t), third)
	if err != nil {
		t.Fatal(err)
	}
	if r3.OutputText() != "answer three" {
		t.Fatalf("third turn: %s", r3.RawJSON())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 3 || s.executed() != 3 {
		t.Fatalf("%d requests sent, %d executed, want 3", len(bodies), s.executed())
	}
	// The earlier turn's instructions are not carried, as OpenAI's are
	// not; the turn's own come first.
	want := []string{"system:be kind", "user:turn one", "assistant:answer one", "user:turn two", "assistant:answer two", "user:turn three"}
	if got := messagesOf(t, bodies[2]); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the third turn sent %q, want %q", got, want)
	}
	// Its input items are the conversation but its instructions, newest
	// first by default.
	page, err := c3.Responses.InputItems.List(testCtx(t), r3.ID, responses.InputItemListParams{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range page.Data {
		got = append(got, it.Role+":"+itemText(t, it))
	}
	if want := []string{"user:turn three", "assistant:answer two", "user:turn two", "assistant:answer one", "user:turn one"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("input items %q, want %q", got, want)
	}
}

// itemText is a message item's text.
func itemText(t *testing.T, it responses.ResponseItemUnion) string {
	t.Helper()
	var m struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal([]byte(it.RawJSON()), &m); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range m.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

func TestResponsesPreviousResponseOfAnotherCallerIsNotFound(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Answer("an answer"))
	r, err := s.client(tokenA).Responses.New(testCtx(t), responseParams("demo", "mine"))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ token, previous string }{
		"another caller's": {tokenB, r.ID},
		"unknown":          {tokenA, "gw-no-such-response"},
	} {
		p := responseParams("demo", "next")
		p.PreviousResponseID = openai.String(tc.previous)
		_, err := s.client(tc.token).Responses.New(testCtx(t), p)
		var e *openai.Error
		if !errors.As(err, &e) || e.StatusCode != http.StatusNotFound || e.Param != "previous_response_id" {
			t.Fatalf("%s previous_response_id: %v, want a 404 naming it", name, err)
		}
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("%d requests executed, want 1", n)
	}
}

func TestResponsesDeleteThenRetrieveIsNotFound(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Answer("soon gone"))
	c := s.client(tokenA)
	r, err := c.Responses.New(testCtx(t), responseParams("demo", "forget this"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.client(tokenB).Responses.Delete(testCtx(t), r.ID); statusOf(err) != http.StatusNotFound {
		t.Fatalf("another caller's delete: %v, want 404", err)
	}
	if err := c.Responses.Delete(testCtx(t), r.ID); err != nil {
		t.Fatal(err)
	}
	other := s.clientAt(s.beside(besideOptions{})+"/v1", tokenA)
	for _, cl := range []*openai.Client{c, other} {
		if _, err := cl.Responses.Get(testCtx(t), r.ID, responses.ResponseGetParams{}); statusOf(err) != http.StatusNotFound {
			t.Fatalf("retrieve after the delete: %v, want 404", err)
		}
		if _, err := cl.Responses.InputItems.List(testCtx(t), r.ID, responses.InputItemListParams{}); statusOf(err) != http.StatusNotFound {
			t.Fatalf("input items after the delete: %v, want 404", err)
		}
	}
	p := responseParams("demo", "and then?")
	p.PreviousResponseID = openai.String(r.ID)
	if _, err := c.Responses.New(testCtx(t), p); statusOf(err) != http.StatusNotFound {
		t.Fatalf("continuing a deleted response: %v, want 404", err)
	}
}

func TestResponsesInputItemsOrder(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Answer("a"))
	c := s.client(tokenA)
	r1, err := c.Responses.New(testCtx(t), responseParams("demo", "one"))
	if err != nil {
		t.Fatal(err)
	}
	p := responseParams("demo", "two")
	p.PreviousResponseID = openai.String(r1.ID)
	r2, err := c.Responses.New(testCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	list := func(q responses.InputItemListParams) string {
		page, err := c.Responses.InputItems.List(testCtx(t), r2.ID, q)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, it := range page.Data {
			out = append(out, itemText(t, it))
		}
		return strings.Join(out, " ")
	}
	if got := list(responses.InputItemListParams{}); got != "two a one" {
		t.Errorf("default order: %q, want newest first", got)
	}
	if got := list(responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc}); got != "one a two" {
		t.Errorf("asc: %q", got)
	}
	// Pages follow each other through after, as the SDK pages them.
	var all []string
	iter := c.Responses.InputItems.ListAutoPaging(testCtx(t), r2.ID, responses.InputItemListParams{Limit: openai.Int(1), Order: responses.InputItemListParamsOrderAsc})
	for iter.Next() {
		all = append(all, itemText(t, iter.Current()))
	}
	if err := iter.Err(); err != nil || strings.Join(all, " ") != "one a two" {
		t.Errorf("paged one by one: %q %v", all, err)
	}
}

// A background stream is the caller's to leave: its leaving, without a
// key, cancels nothing, and a read resumes it after the last event it
// had (starting_after), as OpenAI documents for background streams.
func TestResponsesBackgroundStreamOutlivesItsCallerAndResumes(t *testing.T) {
	s := newGateway(t)
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("one two three four").MidStreamWaitFor(gate))
	c := s.client(tokenA)
	params := responseParams("demo", "count slowly")
	params.Background = openai.Bool(true)
	ctx, leave := context.WithCancel(testCtx(t))
	st := c.Responses.NewStreaming(ctx, params)
	var read []responses.ResponseStreamEventUnion
	for len(read) < 3 && st.Next() {
		read = append(read, st.Current())
	}
	leave()
	_ = st.Close()
	if len(read) != 3 || read[2].SequenceNumber != 2 {
		t.Fatalf("read %d events: %v", len(read), st.Err())
	}
	id := read[0].Response.ID
	close(gate)
	if res := s.result(id); res.State != workflows.StateCompleted {
		t.Fatalf("the action ended %s (%s) after its caller left", res.State, res.Origin)
	}
	rest, _, err := readResponseStream(t, c.Responses.GetStreaming(testCtx(t), id, responses.ResponseGetParams{StartingAfter: openai.Int(2)}), 3)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, ev := range append(read, rest...) {
		if ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
	}
	if last := rest[len(rest)-1]; last.Type != "response.completed" || text.String() != "one two three four" {
		t.Fatalf("resumed to %s with %q", last.Type, text.String())
	}
}

// background and previous_response_id of the wrong type are 400s naming
// them; null asks for nothing.
func TestResponsesStateMembersAreRead(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Answer("ok"))
	for body, param := range map[string]string{
		`{"model":"demo","input":"hi","background":"yes"}`:        "background",
		`{"model":"demo","input":"hi","previous_response_id":5}`:  "previous_response_id",
		`{"model":"demo","input":"hi","previous_response_id":""}`: "previous_response_id",
	} {
		resp, b := s.do(testCtx(t), http.MethodPost, "/v1/responses", tokenA, body, nil)
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Error.Param != param {
			t.Errorf("%s: %d %s, want a 400 naming %s", body, resp.StatusCode, b, param)
		}
	}
	if resp, b := s.do(testCtx(t), http.MethodPost, "/v1/responses", tokenA, `{"model":"demo","input":"hi","previous_response_id":null,"background":false}`, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("null and false: %d %s", resp.StatusCode, b)
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("%d requests executed, want 1", n)
	}
}
