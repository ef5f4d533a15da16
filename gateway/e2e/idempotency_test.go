package e2e_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

const chatBody = `{"model":"demo","messages":[{"role":"user","content":"say hello"}]}`

// The same key, one request after the other: the provider runs once, the
// second answer is the same bytes, marked replayed.
func TestGatewaySameKeySequentialRunsOnce(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Answer("only once"))
	key := map[string]string{"Idempotency-Key": "order-42"}
	r1, b1 := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, chatBody, key)
	// The same request, its members reordered and asked for as a stream
	// now: the same request.
	r2, b2 := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, `{"messages":[{"content":"say hello","role":"user"}], "model":"demo"}`, key)
	if r1.StatusCode != 200 || r2.StatusCode != 200 || string(b1) != string(b2) {
		t.Fatalf("%d %s\n%d %s", r1.StatusCode, b1, r2.StatusCode, b2)
	}
	if r1.Header.Get("X-Durallm-Replayed") != "" || r2.Header.Get("X-Durallm-Replayed") != "true" || r1.Header.Get("X-Durallm-Action-Id") != r2.Header.Get("X-Durallm-Action-Id") {
		t.Fatalf("headers %v / %v", r1.Header, r2.Header)
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("the provider ran %d times", n)
	}
	// Streamed, the replay is the same answer.
	stream := s.client(tokenA, option.WithHeader("Idempotency-Key", "order-42")).Chat.Completions.NewStreaming(testCtx(t), chatParams("demo", "say hello"))
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if stream.Err() != nil || acc.Choices[0].Message.Content != "only once" || s.executed() != 1 {
		t.Fatalf("streamed replay %q %v, executed %d", acc.Choices[0].Message.Content, stream.Err(), s.executed())
	}
}

// The same key, at once: one runs, the others attach; all get the same
// bytes and the provider runs once.
func TestGatewaySameKeyConcurrentRunsOnce(t *testing.T) {
	s := newGateway(t)
	release := make(chan struct{})
	s.p.SetDefault(providertest.Answer("together").WaitFor(release))
	key := map[string]string{"Idempotency-Key": "same-moment"}
	const n = 4
	bodies := make([]string, n)
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, b := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, chatBody, key)
			codes[i], bodies[i] = r.StatusCode, string(b)
		}()
	}
	// Every request is in (waiting on the one action) before the answer.
	deadline := time.Now().Add(20 * time.Second)
	for s.requests.Load() < n || len(s.p.Received()) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the requests did not arrive")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let the last ones reach their wait; not asserted on
	close(release)
	wg.Wait()
	for i := range n {
		if codes[i] != 200 || bodies[i] != bodies[0] {
			t.Fatalf("answer %d: %d %s, want the same 200 as %s", i, codes[i], bodies[i], bodies[0])
		}
	}
	if got := s.executed(); got != 1 {
		t.Fatalf("the provider ran %d times", got)
	}
}

// Another body under a used key: 422, and nothing starts.
func TestGatewaySameKeyOtherBodyIs422(t *testing.T) {
	s := newGateway(t)
	key := map[string]string{"Idempotency-Key": "k-422"}
	if r, b := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, chatBody, key); r.StatusCode != 200 {
		t.Fatalf("%d %s", r.StatusCode, b)
	}
	r, b := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, `{"model":"demo","messages":[{"role":"user","content":"something else"}]}`, key)
	typ, code := errType(t, b)
	if r.StatusCode != 422 || code != "idempotency_key_reused" || typ != "invalid_request_error" || r.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("%d %s %v", r.StatusCode, b, r.Header)
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("the provider ran %d times", n)
	}
}

// Two callers with the same key are two actions.
func TestGatewayTwoCallersSharingAKeyRunTwice(t *testing.T) {
	s := newGateway(t)
	key := map[string]string{"Idempotency-Key": "shared"}
	ra, _ := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, chatBody, key)
	rb, _ := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenB, chatBody, key)
	if ra.StatusCode != 200 || rb.StatusCode != 200 || ra.Header.Get("X-Durallm-Action-Id") == rb.Header.Get("X-Durallm-Action-Id") {
		t.Fatalf("%d %d %s %s", ra.StatusCode, rb.StatusCode, ra.Header.Get("X-Durallm-Action-Id"), rb.Header.Get("X-Durallm-Action-Id"))
	}
	if n := s.executed(); n != 2 {
		t.Fatalf("the provider ran %d times", n)
	}
	// And one caller cannot read the other's action.
	if r, _ := s.do(testCtx(t), http.MethodGet, "/v1/actions/"+rb.Header.Get("X-Durallm-Action-Id"), tokenA, "", nil); r.StatusCode != 404 {
		t.Fatalf("another caller's action: %d", r.StatusCode)
	}
}

// A proxy cuts the connection after forwarding the request. With a key,
// openai-go's retry (X-Stainless-Retry-Count: 1) attaches to the running
// action: the provider runs once. Without one the retry is a new action:
// the provider runs twice.
func TestGatewayCutConnectionRetry(t *testing.T) {
	cutConnectionRetry(t, func(s *gwStack, root, key string) (string, error) {
		var opts []option.RequestOption
		if key != "" {
			opts = append(opts, option.WithHeader("Idempotency-Key", key))
		}
		got, err := s.clientAt(root+"/v1", tokenA, opts...).Chat.Completions.New(testCtx(t), chatParams("demo", "x"))
		if err != nil {
			return "", err
		}
		return got.Choices[0].Message.Content, nil
	})
}

// cutConnectionRetry runs send, one SDK call with its default retries and
// the Idempotency-Key key ("" for none), through a proxy that cuts the
// first connection once the provider has the request: the SDK's retry,
// keyed, attaches to the running action (one execution); keyless, it is a
// new action (two executions, one keyless retry counted, and the first
// action canceled as its caller left).
func cutConnectionRetry(t *testing.T, send func(s *gwStack, root, key string) (text string, err error)) {
	for _, tc := range []struct {
		name     string
		key      bool
		executed int
	}{
		{"keyed: the retry attaches", true, 1},
		{"keyless: the retry runs again", false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newGateway(t)
			// Slow enough that the retry arrives while the first runs.
			s.p.SetDefault(providertest.Answer("slow answer").After(1500 * time.Millisecond))
			proxy := newCutProxy(t, s.srv.URL, func() bool { return len(s.p.Received()) >= 1 })
			key := ""
			if tc.key {
				key = "cut-" + tc.name
			}
			text, err := send(s, strings.TrimSuffix(proxy.url(), "/v1"), key)
			if err != nil {
				t.Fatal(err)
			}
			if text != "slow answer" {
				t.Fatalf("answer %q", text)
			}
			if n := s.requests.Load(); n != 2 {
				t.Fatalf("%d requests reached the gateway, want 2 (the cut one and the retry)", n)
			}
			deadline := time.Now().Add(20 * time.Second)
			for s.executed() < tc.executed && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // a second execution would show by now; the assertion is the count
			if n := s.executed(); n != tc.executed {
				t.Fatalf("the provider ran %d times, want %d", n, tc.executed)
			}
			if want := map[bool]int64{true: 0, false: 1}[tc.key]; s.g.KeylessRetries() != want {
				t.Fatalf("keyless retries counted %d, want %d", s.g.KeylessRetries(), want)
			}
			if !tc.key {
				// The first, keyless action was canceled when its caller left.
				first := s.p.Received()[0].IdempotencyKey
				if res := s.result(first); res.State != workflows.StateCanceled || res.Origin != workflows.OriginClientDisconnect {
					t.Fatalf("the abandoned action ended %s (%s)", res.State, res.Origin)
				}
			}
		})
	}
}

// A cut before any content leaves the action awaiting reconciliation:
// 403, which openai-go does not retry (nor does x-should-retry: false
// ask it to), so exactly one request reaches the gateway. After the operator's verdict the same
// key gets a 200 with the verdict's text.
func TestGatewayAmbiguousIsNotResentThenTheVerdictsAnswer(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo))
	c := s.client(tokenA, option.WithHeader("Idempotency-Key", "lost-answer"))
	_, err := c.Chat.Completions.New(testCtx(t), chatParams("demo", "x"))
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || ae.Type != "durallm_awaiting_reconciliation" {
		t.Fatalf("error %v", err)
	}
	if n := s.requests.Load(); n != 1 {
		t.Fatalf("%d requests reached the gateway with the default MaxRetries, want 1", n)
	}
	id := ae.Response.Header.Get("X-Durallm-Action-Id")
	if !strings.Contains(ae.Message, "/v1/actions/"+id+"/reconcile") {
		t.Fatalf("the message does not say how to resolve it: %s", ae.Message)
	}
	// Only an operator may reconcile.
	if r, _ := s.do(testCtx(t), http.MethodPost, "/v1/actions/"+id+"/reconcile", tokenA, `{"verdict":"completed","text":"x"}`, nil); r.StatusCode != 404 {
		t.Fatalf("a caller reconciled: %d", r.StatusCode)
	}
	// The operator finds it by state, then settles it.
	r, b := s.do(testCtx(t), http.MethodGet, "/v1/actions?state=awaiting_reconciliation", tokenOps, "", nil)
	if r.StatusCode != 200 || (!strings.Contains(string(b), id) && !eventually(func() bool {
		_, b = s.do(testCtx(t), http.MethodGet, "/v1/actions?state=awaiting_reconciliation", tokenOps, "", nil)
		return strings.Contains(string(b), id)
	})) {
		t.Fatalf("list: %d %s", r.StatusCode, b)
	}
	if r, b := s.do(testCtx(t), http.MethodPost, "/v1/actions/"+id+"/reconcile", tokenOps, `{"verdict":"completed","text":"the verdict's text"}`, nil); r.StatusCode != 200 {
		t.Fatalf("reconcile: %d %s", r.StatusCode, b)
	}
	var raw *http.Response
	got, err := c.Chat.Completions.New(testCtx(t), chatParams("demo", "x"), option.WithResponseInto(&raw))
	if err != nil || got.Choices[0].Message.Content != "the verdict's text" || raw.Header.Get("X-Durallm-State") != "reconciled" || raw.Header.Get("X-Durallm-Replayed") != "true" {
		t.Fatalf("after the verdict: %+v %v", got, err)
	}
	if n := len(s.p.Received()); n != 1 {
		t.Fatalf("the provider received %d requests; the ambiguous one must not be re-sent", n)
	}
}

func eventually(cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// readFirstChunk opens a stream and reads until its first content chunk,
// returning the response and a cancel that drops the connection.
func openStreamRaw(t *testing.T, s *gwStack, key string, header map[string]string) (*http.Response, func(), *lineReader) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"demo","stream":true,"messages":[{"role":"user","content":"tell a story"}]}`))
	req.Header.Set("Authorization", "Bearer "+tokenA)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d %s", resp.StatusCode, b)
	}
	return resp, func() { cancel(); resp.Body.Close(); tr.CloseIdleConnections() }, &lineReader{r: resp.Body}
}

// POST /v1/actions/{id}/cancel: the caller's own action ends canceled
// (user_stop), and its waiting request gets 403 durallm_canceled; an
// operator's cancel is operator_stop; another caller's is a 404.
func TestGatewayCancelEndpoint(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Hold())
	for i, tc := range []struct {
		token  string
		origin workflows.CancelOrigin
	}{
		{tokenA, workflows.OriginUserStop},
		{tokenOps, workflows.OriginOperatorStop},
	} {
		key := "cancel-" + string(tc.origin)
		type answer struct {
			code int
			body []byte
		}
		done := make(chan answer, 1)
		go func() {
			r, b := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", tokenA, chatBody, map[string]string{"Idempotency-Key": key})
			done <- answer{r.StatusCode, b}
		}()
		if !eventually(func() bool { return len(s.p.Received()) == i+1 }) {
			t.Fatal("the action never reached the provider")
		}
		id := s.p.Received()[i].IdempotencyKey
		if r, _ := s.do(testCtx(t), http.MethodPost, "/v1/actions/"+id+"/cancel", tokenB, "", nil); r.StatusCode != 404 {
			t.Fatalf("another caller canceled: %d", r.StatusCode)
		}
		if r, b := s.do(testCtx(t), http.MethodPost, "/v1/actions/"+id+"/cancel", tc.token, "", nil); r.StatusCode != 200 {
			t.Fatalf("cancel: %d %s", r.StatusCode, b)
		}
		a := <-done
		if typ, code := errType(t, a.body); a.code != http.StatusForbidden || typ != "durallm_canceled" || code != string(tc.origin) {
			t.Fatalf("the waiting request got %d %s", a.code, a.body)
		}
		if res := s.result(id); res.State != workflows.StateCanceled || res.Origin != tc.origin {
			t.Fatalf("ended %s by %s", res.State, res.Origin)
		}
	}
}
