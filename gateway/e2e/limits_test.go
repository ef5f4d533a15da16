package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/durallm/durallm/testsuite/providertest"
)

// stalledReader opens a stream and, once its headers came, reads no more:
// its receive buffer is small, so the gateway's writes block soon. It
// returns the action's id.
func stalledReader(t *testing.T, s *gwStack, token string, header map[string]string) string {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(s.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	body := `{"model":"demo","stream":true,"messages":[{"role":"user","content":"a long story"}]}`
	var extra strings.Builder
	for k, v := range header {
		extra.WriteString(k + ": " + v + "\r\n")
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s", token, len(body), extra.String(), body)
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 512), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the stream did not start: %v %v", resp, err)
	}
	return resp.Header.Get("X-Durallm-Action-Id")
}

// post sends a JSON chat request as a caller and returns its status.
func (s *gwStack) post(token string) int {
	s.t.Helper()
	r, _ := s.do(testCtx(s.t), http.MethodPost, "/v1/chat/completions", token, chatBody, nil)
	return r.StatusCode
}

// A caller that stops reading its stream is dropped once a write has
// waited the write timeout, and its max_in_flight place is free again:
// its next request is served, not refused.
func TestAStreamReaderThatStopsReadingIsDroppedAndItsPlaceFreed(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.writeTimeout = 500 * time.Millisecond; o.smallBuffers = true })
	s.p.Push(providertest.StreamStall(3000))
	s.p.SetDefault(providertest.Answer("served"))
	stalledReader(t, s, tokenOne, map[string]string{"X-Durallm-On-Disconnect": "continue"})
	deadline := time.Now().Add(20 * time.Second)
	for code := s.post(tokenOne); code == http.StatusTooManyRequests; code = s.post(tokenOne) {
		if time.Now().After(deadline) {
			t.Fatal("the caller that stopped reading still holds its place")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A reader of an action's stream (GET /v1/actions/{id}?stream=true)
// holds one of its caller's max_in_flight places while it reads.
func TestAStreamReadCountsAgainstMaxInFlight(t *testing.T) {
	s := newGateway(t)
	gate := make(chan struct{})
	defer close(gate)
	s.p.Push(providertest.Answer("first then the rest").MidStreamWaitFor(gate))
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"demo","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	req.Header.Set("Authorization", "Bearer "+tokenOne)
	req.Header.Set("X-Durallm-On-Disconnect", "continue")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	id := resp.Header.Get("X-Durallm-Action-Id")
	if _, data, err := (&lineReader{r: resp.Body}).next(); err != nil || contentOf(t, data) != "first" {
		t.Fatalf("first chunk %q %v", data, err)
	}
	cancel()
	resp.Body.Close()
	// The caller reads the action's stream again; meanwhile its one place
	// is taken.
	rctx, stop := context.WithCancel(testCtx(t))
	defer stop()
	rreq, _ := http.NewRequestWithContext(rctx, http.MethodGet, s.srv.URL+"/v1/actions/"+id+"?stream=true&starting_after=1", nil)
	rreq.Header.Set("Authorization", "Bearer "+tokenOne)
	rresp, err := http.DefaultClient.Do(rreq)
	if err != nil || rresp.StatusCode != 200 {
		t.Fatalf("%v %v", rresp, err)
	}
	defer rresp.Body.Close()
	if code := s.post(tokenOne); code != http.StatusTooManyRequests {
		t.Fatalf("a request while the caller reads a stream got %d, want 429", code)
	}
}
