package e2e_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/answer/answertest"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// The core's stateful ops (background, read, cancel, delete, items,
// continuing an earlier action) through a stored surface of no real API
// (answertest.Stored), so that they hold whatever the surface.

func withStored(o *stackOptions) { o.surfaces = []answer.Surface{answertest.Stored{}} }

// storedDo sends a request to base (a gateway's root URL) and decodes
// a 200's object; it returns the status and the raw body.
func storedDo(t *testing.T, base, method, path, token string, body any, out any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(testCtx(t), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode, b
}

// storedStart starts a request on base and returns its object.
func storedStart(t *testing.T, base, token string, req answertest.StoredRequest) answertest.StoredObject {
	t.Helper()
	var o answertest.StoredObject
	if code, b := storedDo(t, base, http.MethodPost, answertest.StoredPath, token, req, &o); code != http.StatusOK {
		t.Fatalf("start: %d %s", code, b)
	}
	return o
}

// storedRead reads an action's object until it is no longer running.
func storedReadEnded(t *testing.T, base, token, id string) answertest.StoredObject {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var o answertest.StoredObject
		if code, b := storedDo(t, base, http.MethodGet, answertest.StoredPath+"/"+id, token, nil, &o); code != http.StatusOK {
			t.Fatalf("read: %d %s", code, b)
		}
		switch workflows.State(o.Status) {
		case workflows.StateQueued, workflows.StateDispatching, workflows.StateBackingOff:
			if time.Now().After(deadline) {
				t.Fatalf("%s still %s", id, o.Status)
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		return o
	}
}

func TestStoredBackgroundAnswersAtOnceAndIsReadLater(t *testing.T) {
	s := newGateway(t, withStored)
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("the background answer").WaitFor(gate))
	base := s.srv.URL
	o := storedStart(t, base, tokenA, answertest.StoredRequest{Model: "demo", Input: "hi", Background: true})
	// The provider has not answered: the start's answer is the running
	// action, not its answer.
	if o.Status != string(workflows.StateQueued) || o.Text != "" || o.ID == "" {
		t.Fatalf("background start answered %+v, want queued without text", o)
	}
	var now answertest.StoredObject
	if code, b := storedDo(t, base, http.MethodGet, answertest.StoredPath+"/"+o.ID, tokenA, nil, &now); code != http.StatusOK || now.Status == "completed" {
		t.Fatalf("read while held: %d %s", code, b)
	}
	close(gate)
	// Read on another gateway: the answer is Temporal's, not a memory.
	got := storedReadEnded(t, s.beside(besideOptions{}), tokenA, o.ID)
	if got.Status != "completed" || got.Text != "the background answer" {
		t.Fatalf("read after the end: %+v", got)
	}
	// Another caller does not see it.
	if code, _ := storedDo(t, base, http.MethodGet, answertest.StoredPath+"/"+o.ID, tokenB, nil, nil); code != http.StatusNotFound {
		t.Fatalf("another caller's read: %d, want 404", code)
	}
}

func TestStoredBackgroundStreamIsResumedAfterN(t *testing.T) {
	s := newGateway(t, withStored)
	s.p.Push(providertest.Answer("one two three four"))
	resp, b := s.do(testCtx(t), http.MethodPost, answertest.StoredPath, tokenA, `{"model":"demo","input":"hi","background":true,"stream":true}`, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "event: done") {
		t.Fatalf("background stream: %d %s", resp.StatusCode, b)
	}
	id := resp.Header.Get("X-Durallm-Action-Id")
	whole := sseEvents(string(b))
	resp, b = s.do(testCtx(t), http.MethodGet, answertest.StoredPath+"/"+id+"?stream=true&starting_after=1", tokenA, "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume: %d %s", resp.StatusCode, b)
	}
	if got, want := sseEvents(string(b)), whole[2:]; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("resumed after 1: %q, want %q", got, want)
	}
}

// sseEvents are a stream's events, each as its lines.
func sseEvents(body string) []string {
	var out []string
	for _, ev := range strings.Split(strings.TrimSpace(body), "\n\n") {
		if !strings.HasPrefix(ev, ":") {
			out = append(out, ev)
		}
	}
	return out
}

func TestStoredCancelIsTheCallersStop(t *testing.T) {
	s := newGateway(t, withStored)
	s.p.SetDefault(providertest.Hold())
	base := s.srv.URL
	o := storedStart(t, base, tokenA, answertest.StoredRequest{Model: "demo", Input: "hi", Background: true})
	// Another caller cannot cancel it.
	if code, _ := storedDo(t, base, http.MethodPost, answertest.StoredPath+"/"+o.ID+"/cancel", tokenB, nil, nil); code != http.StatusNotFound {
		t.Fatalf("another caller's cancel: %d, want 404", code)
	}
	var c answertest.StoredObject
	if code, b := storedDo(t, base, http.MethodPost, answertest.StoredPath+"/"+o.ID+"/cancel", tokenA, nil, &c); code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, b)
	}
	res := s.result(o.ID)
	if res.State != workflows.StateCanceled || res.Origin != workflows.OriginUserStop {
		t.Fatalf("action ended %s (%s), want canceled by user_stop", res.State, res.Origin)
	}
	if got := storedReadEnded(t, base, tokenA, o.ID); got.Status != string(answer.Canceled) || got.Code != string(workflows.OriginUserStop) {
		t.Fatalf("read after the cancel: %+v", got)
	}
	// A cancel of an ended action answers it as it ended.
	var again answertest.StoredObject
	if code, b := storedDo(t, base, http.MethodPost, answertest.StoredPath+"/"+o.ID+"/cancel", tokenA, nil, &again); code != http.StatusOK || again.Status != string(answer.Canceled) {
		t.Fatalf("second cancel: %d %s", code, b)
	}
}

func TestStoredDeleteIsForEveryGateway(t *testing.T) {
	s := newGateway(t, withStored)
	s.p.Push(providertest.Answer("kept until deleted"))
	base := s.srv.URL
	o := storedStart(t, base, tokenA, answertest.StoredRequest{Model: "demo", Input: "hi"})
	if code, _ := storedDo(t, base, http.MethodDelete, answertest.StoredPath+"/"+o.ID, tokenB, nil, nil); code != http.StatusNotFound {
		t.Fatalf("another caller's delete: %d, want 404", code)
	}
	var d answertest.StoredObject
	if code, b := storedDo(t, base, http.MethodDelete, answertest.StoredPath+"/"+o.ID, tokenA, nil, &d); code != http.StatusOK || !d.Deleted || d.ID != o.ID {
		t.Fatalf("delete: %d %s", code, b)
	}
	other := s.beside(besideOptions{})
	for _, b := range []string{base, other} {
		if code, body := storedDo(t, b, http.MethodGet, answertest.StoredPath+"/"+o.ID, tokenA, nil, nil); code != http.StatusNotFound {
			t.Fatalf("read after the delete: %d %s, want 404", code, body)
		}
		if code, _ := storedDo(t, b, http.MethodGet, answertest.StoredPath+"/"+o.ID+"/input_items", tokenA, nil, nil); code != http.StatusNotFound {
			t.Fatalf("items after the delete: %d, want 404", code)
		}
	}
	if code, _ := storedDo(t, base, http.MethodPost, answertest.StoredPath, tokenA, answertest.StoredRequest{Model: "demo", Input: "more", Previous: o.ID}, nil); code != http.StatusNotFound {
		t.Fatalf("continuing a deleted action: %d, want 404", code)
	}
}

func TestStoredDeleteOfARunningActionCancelsItFirst(t *testing.T) {
	s := newGateway(t, withStored)
	s.p.SetDefault(providertest.Hold())
	o := storedStart(t, s.srv.URL, tokenA, answertest.StoredRequest{Model: "demo", Input: "hi", Background: true})
	s.waitState(o.ID, workflows.StateDispatching)
	var d answertest.StoredObject
	if code, b := storedDo(t, s.srv.URL, http.MethodDelete, answertest.StoredPath+"/"+o.ID, tokenA, nil, &d); code != http.StatusOK || !d.Deleted {
		t.Fatalf("delete: %d %s", code, b)
	}
	if code, _ := storedDo(t, s.srv.URL, http.MethodGet, answertest.StoredPath+"/"+o.ID, tokenA, nil, nil); code != http.StatusNotFound {
		t.Fatalf("read after the delete: %d, want 404", code)
	}
}

// messagesOf are the messages of the request the provider received.
func messagesOf(t *testing.T, body []byte) []string {
	t.Helper()
	var b struct {
		Messages []providers.Message `json:"messages"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range b.Messages {
		var text string
		_ = json.Unmarshal(m.Content, &text)
		out = append(out, m.Role+":"+text)
	}
	return out
}

func TestStoredConversationContinuesAcrossGatewayRestarts(t *testing.T) {
	s := newGateway(t, withStored)
	var mu sync.Mutex
	var bodies [][]byte
	s.p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, r.Body)
		return providertest.Behavior{}, false
	})
	s.p.Push(providertest.Answer("answer one"), providertest.Answer("answer two"), providertest.Answer("answer three"))
	// Each turn goes to a gateway started after the previous turn ended,
	// which holds nothing of it: the conversation is Temporal's.
	first := storedStart(t, s.srv.URL, tokenA, answertest.StoredRequest{Model: "demo", Input: "turn one", Instructions: "be brief"})
	second := storedStart(t, s.beside(besideOptions{hub: true}), tokenA, answertest.StoredRequest{Model: "demo", Input: "turn two", Previous: first.ID})
	third := storedStart(t, s.beside(besideOptions{hub: true}), tokenA, answertest.StoredRequest{Model: "demo", Input: "turn three", Previous: second.ID, Instructions: "be kind"})
	if third.Text != "answer three" {
		t.Fatalf("third turn: %+v", third)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 3 || s.executed() != 3 {
		t.Fatalf("%d requests sent, %d executed, want 3", len(bodies), s.executed())
	}
	// The earlier instructions are not carried; the turn's own are.
	want := []string{"system:be kind", "user:turn one", "assistant:answer one", "user:turn two", "assistant:answer two", "user:turn three"}
	if got := messagesOf(t, bodies[2]); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("third turn sent %q, want %q", got, want)
	}
	// Its items are the conversation but its instructions, newest first.
	var items answertest.StoredItems
	if code, b := storedDo(t, s.srv.URL, http.MethodGet, answertest.StoredPath+"/"+third.ID+"/input_items", tokenA, nil, &items); code != http.StatusOK {
		t.Fatalf("items: %d %s", code, b)
	}
	var roles []string
	for _, it := range items.Data {
		roles = append(roles, it.Role+":"+it.Text)
	}
	if wantItems := []string{"user:turn three", "assistant:answer two", "user:turn two", "assistant:answer one", "user:turn one"}; strings.Join(roles, "|") != strings.Join(wantItems, "|") {
		t.Fatalf("items %q, want %q", roles, wantItems)
	}
}

func TestStoredContinuingAnotherCallersActionIsNotFound(t *testing.T) {
	s := newGateway(t, withStored)
	s.p.SetDefault(providertest.Answer("an answer"))
	first := storedStart(t, s.srv.URL, tokenA, answertest.StoredRequest{Model: "demo", Input: "mine"})
	for _, tc := range []struct{ name, token, previous string }{
		{"another caller's", tokenB, first.ID},
		{"unknown", tokenA, "act_no_such_action"},
	} {
		code, b := storedDo(t, s.srv.URL, http.MethodPost, answertest.StoredPath, tc.token, answertest.StoredRequest{Model: "demo", Input: "yours?", Previous: tc.previous}, nil)
		if code != http.StatusNotFound {
			t.Fatalf("%s: %d %s, want 404", tc.name, code, b)
		}
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error.Param != "previous" {
			t.Fatalf("%s: %s, want the param named", tc.name, b)
		}
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("%d requests executed, want 1", n)
	}
}

func TestStoredContinuingAnUnansweredActionIsRefused(t *testing.T) {
	s := newGateway(t, withStored)
	s.p.SetDefault(providertest.Hold())
	running := storedStart(t, s.srv.URL, tokenA, answertest.StoredRequest{Model: "demo", Input: "slow", Background: true})
	code, b := storedDo(t, s.srv.URL, http.MethodPost, answertest.StoredPath, tokenA, answertest.StoredRequest{Model: "demo", Input: "next", Previous: running.ID}, nil)
	if code != http.StatusBadRequest {
		t.Fatalf("continuing a running action: %d %s, want 400", code, b)
	}
	if code, b := storedDo(t, s.srv.URL, http.MethodPost, answertest.StoredPath+"/"+running.ID+"/cancel", tokenA, nil, nil); code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, b)
	}
	s.result(running.ID)
	code, b = storedDo(t, s.srv.URL, http.MethodPost, answertest.StoredPath, tokenA, answertest.StoredRequest{Model: "demo", Input: "next", Previous: running.ID}, nil)
	if code != http.StatusBadRequest {
		t.Fatalf("continuing a canceled action: %d %s, want 400", code, b)
	}
}

func TestStoredItemsPageInOrder(t *testing.T) {
	s := newGateway(t, withStored)
	s.p.SetDefault(providertest.Answer("a"))
	first := storedStart(t, s.srv.URL, tokenA, answertest.StoredRequest{Model: "demo", Input: "one"})
	second := storedStart(t, s.srv.URL, tokenA, answertest.StoredRequest{Model: "demo", Input: "two", Previous: first.ID})
	list := func(query string) []string {
		var items answertest.StoredItems
		if code, b := storedDo(t, s.srv.URL, http.MethodGet, answertest.StoredPath+"/"+second.ID+"/input_items"+query, tokenA, nil, &items); code != http.StatusOK {
			t.Fatalf("items%s: %d %s", query, code, b)
		}
		var ids []string
		for _, it := range items.Data {
			ids = append(ids, it.ID)
		}
		return ids
	}
	for query, want := range map[string]string{
		"":                          "item_2 item_1 item_0",
		"?order=asc":                "item_0 item_1 item_2",
		"?limit=1":                  "item_2",
		"?order=asc&after=item_0":   "item_1 item_2",
		"?after=item_2&limit=1":     "item_1",
		"?order=desc&after=item_0":  "",
		"?order=asc&limit=2&after=": "item_0 item_1",
	} {
		if got := strings.Join(list(query), " "); got != want {
			t.Errorf("items%s: %q, want %q", query, got, want)
		}
	}
	if code, _ := storedDo(t, s.srv.URL, http.MethodGet, answertest.StoredPath+"/"+second.ID+"/input_items?order=sideways", tokenA, nil, nil); code != http.StatusBadRequest {
		t.Fatalf("a bad order: %d, want 400", code)
	}
}
