package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/durallm/durallm/gateway"
	"github.com/durallm/durallm/testsuite/providertest"
)

// scripted streams exactly these content chunks, then the finish reason,
// usage and [DONE], as OpenAI does.
func scripted(chunks ...string) providertest.Behavior {
	var b strings.Builder
	ev := func(v any) {
		j, _ := json.Marshal(v)
		b.WriteString("data: " + string(j) + "\n\n")
	}
	type delta struct {
		Role    string `json:"role,omitempty"`
		Content string `json:"content"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Delta        delta   `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	}
	chunk := func(ch []choice, usage any) map[string]any {
		return map[string]any{"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": ch, "usage": usage}
	}
	for i, c := range chunks {
		d := delta{Content: c}
		if i == 0 {
			d.Role = "assistant"
		}
		ev(chunk([]choice{{Delta: d}}, nil))
	}
	stop := "stop"
	ev(chunk([]choice{{Delta: delta{}, FinishReason: &stop}}, nil))
	ev(chunk([]choice{}, map[string]int{"prompt_tokens": 3, "completion_tokens": len(chunks), "total_tokens": 3 + len(chunks)}))
	b.WriteString("data: [DONE]\n\n")
	return providertest.Status(200, http.Header{"Content-Type": {"text/event-stream"}}, b.String())
}

// sseEvent is one event of a stream as a client reads it.
type sseEvent struct {
	id, data string
}

// readAll reads a stream's events to its end.
func readAll(t *testing.T, body io.Reader) []sseEvent {
	t.Helper()
	lr := &lineReader{r: body}
	var out []sseEvent
	for {
		id, data, err := lr.next()
		if err != nil {
			return out
		}
		out = append(out, sseEvent{id, data})
	}
}

// get sends an authenticated GET to a gateway's base URL.
func get(t *testing.T, ctx context.Context, base, path string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tokenA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// textOf is the content the events carry.
func textOf(t *testing.T, evs []sseEvent) string {
	var b strings.Builder
	for _, e := range evs {
		if e.data != "[DONE]" && !strings.HasPrefix(e.data, `{"error"`) {
			b.WriteString(contentOf(t, e.data))
		}
	}
	return b.String()
}

// A stream read to its end, then resumed after each of its numbered
// events (starting_after=N), gives exactly the events after N, byte for
// byte, then [DONE]: on the gateway that served it, on a gateway without
// a worker (--worker=false), and on a gateway restarted since (an empty
// hub). The answer ends as it began (a closing code fence), which a
// resumption that matched text rather than counting it would repeat.
func TestAResumedStreamGivesExactlyTheRemainingText(t *testing.T) {
	s := newGateway(t)
	chunks := []string{"```", "go\n", "x := 1\n", "```"}
	const text = "```go\nx := 1\n```"
	s.p.Push(scripted(chunks...))
	resp, b := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA,
		`{"model":"demo","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a fence"}]}`, nil)
	id := resp.Header.Get("X-Durallm-Action-Id")
	full := readAll(t, strings.NewReader(string(b)))
	if got := textOf(t, full); got != text || full[len(full)-1].data != "[DONE]" {
		t.Fatalf("the whole stream: %q %+v", got, full)
	}
	last := 0
	for i, e := range full {
		if e.id != strconv.Itoa(i+1) && e.id != "" {
			t.Fatalf("event %d has id %q: the ids count the stream's events from 1", i, e.id)
		}
		if e.id != "" {
			last = i + 1
		}
	}
	for _, gw := range []struct {
		name, base string
	}{
		{"the gateway that served it", s.srv.URL},
		{"a gateway without a worker", s.beside(besideOptions{remote: &gateway.RemoteStreams{}})},
		{"a restarted gateway", s.beside(besideOptions{hub: true, remote: &gateway.RemoteStreams{}})},
	} {
		for n := 0; n <= last; n++ {
			r := get(t, testCtx(t), gw.base, "/v1/actions/"+id+"?stream=true&starting_after="+strconv.Itoa(n))
			got := readAll(t, r.Body)
			r.Body.Close()
			want := full[n:]
			if len(got) != len(want) {
				t.Fatalf("%s, after %d: %d events, want %d:\n got %+v\nwant %+v", gw.name, n, len(got), len(want), got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s, after %d: event %d is %+v, want %+v", gw.name, n, i, got[i], want[i])
				}
			}
			if textOf(t, full[:n])+textOf(t, got) != text {
				t.Fatalf("%s, after %d: the text read and resumed is not the answer", gw.name, n)
			}
		}
	}
}

// A gateway reading a stream from a worker elsewhere (--worker=false)
// whose connection to the worker is cut reads it again from where it
// was, and the caller gets the rest live, while the action still runs.
func TestAWorkersStreamCutOnItsWayToTheGatewayIsReadAgain(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.workerStreams = true })
	proxy := newTCPProxy(t, s.w.StreamAddr())
	base := s.beside(besideOptions{remote: &gateway.RemoteStreams{HTTP: proxy.client()}})
	gate := make(chan struct{})
	s.p.Push(providertest.StreamStall(3).MidStreamWaitFor(gate))
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"demo","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	req.Header.Set("Authorization", "Bearer "+tokenA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	id := resp.Header.Get("X-Durallm-Action-Id")
	lr := &lineReader{r: resp.Body}
	if _, data, err := lr.next(); err != nil || contentOf(t, data) != "chunk1" {
		t.Fatalf("first chunk %q %v", data, err)
	}
	proxy.cut()
	close(gate)
	var rest strings.Builder
	for rest.String() != " chunk2 chunk3" {
		_, data, err := lr.next()
		if err != nil {
			t.Fatalf("the stream ended after %q: %v", rest.String(), err)
		}
		rest.WriteString(contentOf(t, data))
	}
	if st, err := s.c.Status(context.Background(), id); err != nil || st.State.Terminal() {
		t.Fatalf("the rest came only with the result: the action is %s (%v)", st.State, err)
	}
}
