package e2e_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// lineReader reads a stream's data lines.
type lineReader struct {
	r  io.Reader
	br *bufio.Reader
}

// next returns the next data line's payload and its id ("" for none), or
// io.EOF.
func (l *lineReader) next() (id, data string, err error) {
	if l.br == nil {
		l.br = bufio.NewReader(l.r)
	}
	for {
		line, err := l.br.ReadString('\n')
		if err != nil {
			return "", "", err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			return id, strings.TrimPrefix(line, "data: "), nil
		}
	}
}

// contentOf is a chunk's content delta.
func contentOf(t *testing.T, data string) string {
	t.Helper()
	var c openai.ChatCompletionChunk
	if err := json.Unmarshal([]byte(data), &c); err != nil {
		t.Fatalf("chunk %s: %v", data, err)
	}
	if len(c.Choices) == 0 {
		return ""
	}
	return c.Choices[0].Delta.Content
}

// A keyless caller that leaves mid-stream cancels its action at once
// (client_disconnect): one attempt, no health moved, and the result keeps
// the text that was delivered.
func TestGatewayKeylessMidStreamDisconnectCancels(t *testing.T) {
	s := newGateway(t)
	gate := make(chan struct{})
	defer close(gate)
	s.p.Push(providertest.Answer("first then the rest").MidStreamWaitFor(gate))
	resp, drop, lr := openStreamRaw(t, s, "", nil)
	id := resp.Header.Get("X-Durallm-Action-Id")
	if _, data, err := lr.next(); err != nil || contentOf(t, data) != "first" {
		t.Fatalf("first chunk %q %v", data, err)
	}
	drop()
	res := s.result(id)
	if res.State != workflows.StateCanceled || res.Origin != workflows.OriginClientDisconnect || len(res.Attempts) != 1 || res.Attempts[0].HealthMoved {
		t.Fatalf("state %s origin %s attempts %+v", res.State, res.Origin, res.Attempts)
	}
	if res.Response == nil || res.Response.Text != "first" || !res.Response.Partial || res.Response.Incomplete != "canceled" {
		t.Fatalf("the canceled result does not keep the delivered text: %+v", res.Response)
	}
}

// A keyed caller that leaves mid-stream and comes back within the
// disconnect grace attaches, and reads the whole answer from the start.
func TestGatewayKeyedReattachWithinTheGraceGetsTheWholeAnswer(t *testing.T) {
	s := newGateway(t)
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("first and then the rest").MidStreamWaitFor(gate))
	_, drop, lr := openStreamRaw(t, s, "story-1", nil)
	if _, data, err := lr.next(); err != nil || contentOf(t, data) != "first" {
		t.Fatalf("first chunk %q %v", data, err)
	}
	drop()
	stream := s.client(tokenA, option.WithHeader("Idempotency-Key", "story-1")).Chat.Completions.NewStreaming(testCtx(t),
		openai.ChatCompletionNewParams{Model: "demo", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell a story")}})
	close(gate)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if stream.Err() != nil || acc.Choices[0].Message.Content != "first and then the rest" {
		t.Fatalf("re-attached stream %q %v", acc.Choices[0].Message.Content, stream.Err())
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("the provider ran %d times", n)
	}
}

// A disconnect before the commit cancels before any content: canceled,
// one attempt, no fallback.
func TestGatewayDisconnectBeforeTheCommitMakesNoFallback(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.streamHold = 50 * time.Millisecond }) // the 200 goes out before content
	s.p.Push(providertest.Hold())
	resp, drop, _ := openStreamRaw(t, s, "", nil)
	id := resp.Header.Get("X-Durallm-Action-Id")
	// The attempt is at the provider; then the caller leaves.
	if !eventually(func() bool { return len(s.p.Received()) == 1 }) {
		t.Fatal("the request never reached the provider")
	}
	drop()
	res := s.result(id)
	if res.State != workflows.StateCanceled || res.Origin != workflows.OriginClientDisconnect || len(res.Attempts) != 1 || res.Attempts[0].HealthMoved || res.Response != nil {
		t.Fatalf("state %s origin %s attempts %d response %+v", res.State, res.Origin, len(res.Attempts), res.Response)
	}
	if n := len(s.p.Received()); n != 1 {
		t.Fatalf("the provider received %d requests: a fallback after the disconnect", n)
	}
}

// A caller that leaves with on_disconnect continue: the action runs on,
// GET /v1/actions/{id} returns its answer, and starting_after resumes its
// stream after the last chunk read.
func TestGatewayDepartedCallersAnswerAndResumedStream(t *testing.T) {
	s := newGateway(t)
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("first second third").MidStreamWaitFor(gate))
	resp, drop, lr := openStreamRaw(t, s, "", map[string]string{"X-Durallm-On-Disconnect": "continue"})
	id := resp.Header.Get("X-Durallm-Action-Id")
	seq, data, err := lr.next()
	if err != nil || contentOf(t, data) != "first" || seq == "" {
		t.Fatalf("first chunk %s %q %v", seq, data, err)
	}
	drop()
	close(gate)
	if res := s.result(id); res.State != workflows.StateCompleted {
		t.Fatalf("the departed caller's action ended %s", res.State)
	}
	r, b := s.do(testCtx(t), http.MethodGet, "/v1/actions/"+id, tokenA, "", nil)
	var v struct {
		State      string                `json:"state"`
		Attempts   []json.RawMessage     `json:"attempts"`
		Completion openai.ChatCompletion `json:"completion"`
	}
	if err := json.Unmarshal(b, &v); err != nil || r.StatusCode != 200 || v.State != "completed" || len(v.Attempts) != 1 ||
		v.Completion.Choices[0].Message.Content != "first second third" || v.Completion.ID != id {
		t.Fatalf("%d %s (%v)", r.StatusCode, b, err)
	}
	// Resume after the chunk already read.
	req, _ := http.NewRequest(http.MethodGet, s.srv.URL+"/v1/actions/"+id+"?stream=true&starting_after="+seq, nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	sr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Body.Close()
	rest := &lineReader{r: sr.Body}
	text := "first"
	for {
		_, data, err := rest.next()
		if err != nil {
			t.Fatalf("the resumed stream ended without [DONE]: %v", err)
		}
		if data == "[DONE]" {
			break
		}
		text += contentOf(t, data)
	}
	if text != "first second third" {
		t.Fatalf("first chunk plus the resumed stream: %q", text)
	}
}

// A keyed caller that leaves, retries 3 s later, leaves again and retries
// 8 s after that attaches both times: each retry's leaving starts its own
// grace (10 s), and the first one's, which ends between the two retries,
// cancels nothing. The provider runs once and the last retry reads the
// whole answer.
func TestAKeyedRetryInsideItsGraceIsNeverCanceled(t *testing.T) {
	s := newGateway(t)
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("first and then the rest").MidStreamWaitFor(gate))
	_, drop, lr := openStreamRaw(t, s, "graced", nil)
	if _, data, err := lr.next(); err != nil || contentOf(t, data) != "first" {
		t.Fatalf("first chunk %q %v", data, err)
	}
	drop()
	time.Sleep(3 * time.Second) // the caller's retry comes 3 s later
	_, drop, lr = openStreamRaw(t, s, "graced", nil)
	if _, data, err := lr.next(); err != nil || contentOf(t, data) != "first" {
		t.Fatalf("the retry at 3 s: first chunk %q %v", data, err)
	}
	drop()
	time.Sleep(8 * time.Second) // and the next one 8 s after that
	stream := s.client(tokenA, option.WithHeader("Idempotency-Key", "graced")).Chat.Completions.NewStreaming(testCtx(t), chatParams("demo", "tell a story"))
	if !stream.Next() {
		t.Fatalf("the retry at 8 s: %v", stream.Err())
	}
	close(gate)
	text := stream.Current().Choices[0].Delta.Content
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			text += ch.Choices[0].Delta.Content
		}
	}
	if stream.Err() != nil || text != "first and then the rest" {
		t.Fatalf("the retry at 8 s read %q: %v", text, stream.Err())
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("the provider ran %d times", n)
	}
}
