package providertest

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// storedBody is a chat request that asks to be stored with metadata.
func storedBody(stream bool, meta map[string]string) string {
	b, _ := json.Marshal(map[string]any{
		"model": "m", "stream": stream, "store": true, "metadata": meta,
		"messages": []map[string]string{{"role": "user", "content": "hi"}},
	})
	return string(b)
}

type storedListJSON struct {
	Object string `json:"object"`
	Data   []struct {
		ID       string            `json:"id"`
		Object   string            `json:"object"`
		Metadata map[string]string `json:"metadata"`
		Choices  []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct {
						Name string `json:"name"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	} `json:"data"`
	FirstID *string `json:"first_id"`
	HasMore bool    `json:"has_more"`
}

// listStored lists through client c at base, with the query q.
func listStored(t *testing.T, c *http.Client, base string, q url.Values) storedListJSON {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/chat/completions?"+q.Encode(), nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("list: status %d", resp.StatusCode)
	}
	var l storedListJSON
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	return l
}

func byAttempt(id string) url.Values { return url.Values{"metadata[durallm_attempt_id]": {id}} }

func TestStoredCompletionsAreListedByMetadataOverBothProtocols(t *testing.T) {
	p := newTestProvider(t)
	h2 := &http.Client{Transport: tlsTransport(t, p)}
	for _, tc := range []struct {
		name   string
		c      *http.Client
		base   string
		stream bool
	}{
		{"http2", h2, p.URL(), false},
		{"http2 stream", h2, p.URL(), true},
		{"http1.1", h1Client(p), p.HTTP1URL(), false},
		{"http1.1 stream", h1Client(p), p.HTTP1URL(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "att-" + strings.ReplaceAll(tc.name, " ", "-")
			p.Push(Answer("the stored answer"))
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, tc.base+"/v1/chat/completions", strings.NewReader(storedBody(tc.stream, map[string]string{"durallm_attempt_id": id, "mine": "kept"})))
			resp, err := tc.c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			answered := readAnswerID(t, resp, tc.stream)
			before := len(p.Processed())
			l := listStored(t, tc.c, tc.base, byAttempt(id))
			if len(l.Data) != 1 || l.Object != "list" || l.HasMore {
				t.Fatalf("list: %+v", l)
			}
			got := l.Data[0]
			if got.ID != answered || got.Object != "chat.completion" || got.Metadata["mine"] != "kept" ||
				*got.Choices[0].Message.Content != "the stored answer" || got.Choices[0].FinishReason != "stop" || got.Usage.TotalTokens == 0 {
				t.Fatalf("stored %+v, answered id %s", got, answered)
			}
			if len(p.Processed()) != before {
				t.Fatal("the lookup was recorded as an execution")
			}
			if other := listStored(t, tc.c, tc.base, byAttempt("someone-else")); len(other.Data) != 0 {
				t.Fatalf("another attempt's lookup found %d", len(other.Data))
			}
		})
	}
}

// readAnswerID reads the answer's id from a JSON body or the stream's
// first event.
func readAnswerID(t *testing.T, resp *http.Response, stream bool) string {
	t.Helper()
	defer resp.Body.Close()
	var v struct {
		ID string `json:"id"`
	}
	if stream {
		data, err := sseReader{bufio.NewReader(resp.Body)}.next()
		if err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal([]byte(data), &v)
	} else if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if v.ID == "" {
		t.Fatal("answer without id")
	}
	return v.ID
}

func TestStoredCompletionOfAToolCallKeepsTheCall(t *testing.T) {
	p := newTestProvider(t)
	c := h1Client(p)
	p.Push(AnswerToolCall("lookup", `{"q":"x"}`))
	resp, body, err := h1Post(t, c, p.HTTP1URL(), storedBody(false, map[string]string{"durallm_attempt_id": "a1"}))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatal(resp, err)
	}
	var answered storedListJSON
	_ = json.Unmarshal([]byte(`{"data":[`+string(body)+`]}`), &answered)
	l := listStored(t, c, p.HTTP1URL(), byAttempt("a1"))
	if len(l.Data) != 1 || l.Data[0].Choices[0].FinishReason != "tool_calls" || l.Data[0].Choices[0].Message.ToolCalls[0].Function.Name != "lookup" ||
		l.Data[0].Choices[0].Message.ToolCalls[0].ID != answered.Data[0].Choices[0].Message.ToolCalls[0].ID {
		t.Fatalf("stored %+v, answered %+v", l, answered)
	}
}

func TestStoredCompletionIsKeptWhenTheClientLeavesMidGeneration(t *testing.T) {
	p := newTestProvider(t)
	c := h1Client(p)
	release := make(chan struct{})
	p.Push(Answer("generated anyway").WaitFor(release))
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.HTTP1URL()+"/v1/chat/completions", strings.NewReader(storedBody(false, map[string]string{"durallm_attempt_id": "gone"})))
	ctx, cancel := context.WithCancel(testCtx(t))
	req = req.WithContext(ctx)
	done := make(chan error, 1)
	go func() {
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, "the request to execute", func() bool { return len(p.Processed()) == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the canceled request got an answer")
	}
	close(release)
	if l := listStored(t, c, p.HTTP1URL(), byAttempt("gone")); len(l.Data) != 1 || *l.Data[0].Choices[0].Message.Content != "generated anyway" {
		t.Fatalf("list: %+v", l)
	}
}

func TestStoredCompletionsBranches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(p *Provider)
		b     Behavior
		store bool
		want  int
	}{
		{"not asked to store", nil, Answer("x"), false, 0},
		{"stored", nil, Answer("x"), true, 1},
		{"unstored", nil, Answer("x").Unstored(), true, 0},
		{"a fault stores nothing", nil, ServerError(http.StatusInternalServerError), true, 0},
		{"a cut stream stores nothing", nil, StreamCut(2, CutReset), true, 0},
		{"lag longer than the lookup", func(p *Provider) { p.SetStoreLag(time.Hour) }, Answer("x"), true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProvider(t)
			if tc.setup != nil {
				tc.setup(p)
			}
			c := h1Client(p)
			p.Push(tc.b)
			body := storedBody(false, map[string]string{"durallm_attempt_id": "a"})
			if !tc.store {
				body = strings.Replace(body, `"store":true`, `"store":false`, 1)
			}
			if _, _, err := h1Post(t, c, p.HTTP1URL(), body); err != nil && tc.want > 0 {
				t.Fatal(err)
			}
			if l := listStored(t, c, p.HTTP1URL(), byAttempt("a")); len(l.Data) != tc.want {
				t.Fatalf("listed %d, want %d", len(l.Data), tc.want)
			}
		})
	}
}

func TestStoreLagAndDrop(t *testing.T) {
	p := newTestProvider(t)
	c := h1Client(p)
	p.SetStoreLag(time.Hour)
	for range 2 {
		if _, _, err := h1Post(t, c, p.HTTP1URL(), storedBody(false, map[string]string{"durallm_attempt_id": "twice"})); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := h1Post(t, c, p.HTTP1URL(), storedBody(false, map[string]string{"durallm_attempt_id": "other"})); err != nil {
		t.Fatal(err)
	}
	if l := listStored(t, c, p.HTTP1URL(), byAttempt("twice")); len(l.Data) != 0 || len(p.Stored()) != 3 {
		t.Fatalf("within the lag: listed %d, kept %d", len(l.Data), len(p.Stored()))
	}
	p.SetStoreLag(0)
	l := listStored(t, c, p.HTTP1URL(), byAttempt("twice"))
	if len(l.Data) != 2 || l.Data[0].ID == l.Data[1].ID || *l.FirstID != l.Data[0].ID {
		t.Fatalf("after the lag: %+v", l)
	}
	page := listStored(t, c, p.HTTP1URL(), url.Values{"metadata[durallm_attempt_id]": {"twice"}, "limit": {"1"}, "order": {"desc"}})
	if len(page.Data) != 1 || !page.HasMore || page.Data[0].ID != l.Data[1].ID {
		t.Fatalf("desc page of 1: %+v", page)
	}
	if n := p.DropStored("durallm_attempt_id", "twice"); n != 2 {
		t.Fatalf("dropped %d", n)
	}
	if l := listStored(t, c, p.HTTP1URL(), byAttempt("twice")); len(l.Data) != 0 || len(p.Stored()) != 1 {
		t.Fatalf("after the drop: listed %d, kept %d", len(l.Data), len(p.Stored()))
	}
}

func TestALookupTakesNoQueuedBehaviourAndTheScriptMayFaultIt(t *testing.T) {
	p := newTestProvider(t)
	c := h1Client(p)
	p.Script(func(r Request) (Behavior, bool) {
		if isStoredList(r) && r.Header.Get("Authorization") == "Bearer faulty" {
			return Unavailable(nil), true
		}
		return Behavior{}, false
	})
	p.Push(Answer("queued for the model"))
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, p.HTTP1URL()+"/v1/chat/completions?metadata[k]=v", nil)
	req.Header.Set("Authorization", "Bearer faulty")
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("scripted lookup: %v %v", resp, err)
	}
	resp.Body.Close()
	if l := listStored(t, c, p.HTTP1URL(), url.Values{"metadata[k]": {"v"}}); len(l.Data) != 0 {
		t.Fatal(l)
	}
	_, body, err := h1Post(t, c, p.HTTP1URL(), `{"model":"m"}`)
	if err != nil || !strings.Contains(string(body), "queued for the model") {
		t.Fatalf("the model request did not get the queued answer: %s %v", body, err)
	}
}
