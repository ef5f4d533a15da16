package activities

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// sseMsg is one event, or one comment, as a client parses the stream.
type sseMsg struct {
	ID, Event, Data string
	Comment         string
}

type sseReader struct{ r *bufio.Reader }

// next returns the next event or comment, io.EOF at a clean end of stream.
// It fails on anything this handler never sends (a field other than id,
// event and data, a data field split over lines), so the tests check the
// wire format too.
func (r *sseReader) next() (sseMsg, error) {
	var m sseMsg
	have := false
	for {
		line, err := r.r.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" && !have {
				return m, io.EOF
			}
			return m, fmt.Errorf("read stream: %w", err)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if have {
				return m, nil
			}
		case strings.HasPrefix(line, ":"):
			if have {
				return m, fmt.Errorf("comment %q inside an event", line)
			}
			return sseMsg{Comment: strings.TrimSpace(line[1:])}, nil
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				m.ID = value
			case "event":
				m.Event = value
			case "data":
				if m.Data != "" {
					return m, fmt.Errorf("second data line %q", value)
				}
				m.Data = value
			default:
				return m, fmt.Errorf("unexpected field %q", line)
			}
			have = true
		}
	}
}

// nextEvent skips comments.
func (r *sseReader) nextEvent() (sseMsg, error) {
	for {
		m, err := r.next()
		if err != nil || m.Comment == "" {
			return m, err
		}
	}
}

// subscribers counts the live subscriptions of ref, straight from the
// registry: the observable effect of a handler subscribing or leaving.
func subscribers(s *Streams, ref string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs[ref])
}

func allSubscribers(s *Streams) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, subs := range s.subs {
		n += len(subs)
	}
	return n
}

// waitFor polls cond, bounded: the handler's exit after a disconnect is
// asynchronous and has no other observable signal.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// protocols runs f over HTTP/1.1 and over HTTP/2 (TLS), the two ways a
// caller reaches the endpoint.
func protocols(t *testing.T, h http.Handler, f func(t *testing.T, base string, c *http.Client)) {
	t.Run("http1", func(t *testing.T) {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		f(t, srv.URL, srv.Client())
	})
	t.Run("http2", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(h)
		srv.EnableHTTP2 = true
		srv.StartTLS()
		t.Cleanup(srv.Close)
		f(t, srv.URL, srv.Client())
	})
}

func get(ctx context.Context, t *testing.T, c *http.Client, url, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// openStream opens a stream and checks the response: once it returns, the
// handler has subscribed.
func openStream(ctx context.Context, t *testing.T, c *http.Client, url string) (*http.Response, *sseReader) {
	t.Helper()
	resp := get(ctx, t, c, url, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	return resp, &sseReader{r: bufio.NewReader(resp.Body)}
}

func TestStreamHandlerDeliversEventsInOrder(t *testing.T) {
	s := NewStreams()
	h := s.StreamHandler(StreamHandlerOptions{KeepAlive: time.Hour})
	protocols(t, h, func(t *testing.T, base string, c *http.Client) {
		ctx := testCtx(t)
		resp, r := openStream(ctx, t, c, base+"/v1/streams/act-1")
		if resp.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("cache control %q", resp.Header.Get("Cache-Control"))
		}
		if n := subscribers(s, "act-1"); n != 1 {
			t.Fatalf("%d subscribers after the headers, want 1", n)
		}

		// The activity's path: one sink per attempt. Attempt 2 streams
		// after attempt 1 failed before its commit (no deltas).
		a := s.forAttempt("act-1", 2)
		a.Delta("Hel")
		s.forAttempt("act-2", 1).Delta("not this action's")
		a.Delta("lo \"wörld\"\n</script>\r\ndata: x")
		a.Incomplete("idle_timeout")

		want := []sseMsg{
			{ID: "1", Event: "delta", Data: `{"attempt":2,"delta":"Hel"}`},
			{ID: "2", Event: "delta", Data: `{"attempt":2,"delta":"lo \"wörld\"\n\u003c/script\u003e\r\ndata: x"}`},
			{ID: "3", Event: "stream_incomplete", Data: `{"attempt":2,"reason":"idle_timeout"}`},
		}
		for i, w := range want {
			got, err := r.next()
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			if got != w {
				t.Fatalf("event %d:\n got %+v\nwant %+v", i, got, w)
			}
		}
		var d sseDelta
		if err := json.Unmarshal([]byte(want[1].Data), &d); err != nil || d.Delta != "lo \"wörld\"\n</script>\r\ndata: x" {
			t.Fatalf("the data does not decode to the delta: %+v %v", d, err)
		}
		// stream_incomplete is final: the stream ends, unsubscribed.
		if m, err := r.next(); !errors.Is(err, io.EOF) {
			t.Fatalf("after stream_incomplete: %+v %v, want the end of the stream", m, err)
		}
		if n := subscribers(s, "act-1"); n != 0 {
			t.Fatalf("%d subscribers after the stream ended", n)
		}
	})
}

func TestStreamHandlerAuth(t *testing.T) {
	s := NewStreams()
	srv := httptest.NewServer(s.StreamHandler(StreamHandlerOptions{AuthToken: "s3cret", KeepAlive: time.Hour}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		header string
		status int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer wrong", http.StatusUnauthorized},
		{"Bearer s3cret-and-more", http.StatusUnauthorized},
		{"Bearer", http.StatusUnauthorized},
		{"Basic s3cret", http.StatusUnauthorized},
		{"s3cret", http.StatusUnauthorized},
		{"Bearer s3cret", http.StatusOK},
		{"bearer s3cret", http.StatusOK},
	} {
		t.Run(tc.header, func(t *testing.T) {
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			resp := get(ctx, t, srv.Client(), srv.URL+"/v1/streams/act", tc.header)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.status == http.StatusUnauthorized {
				if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Fatalf("WWW-Authenticate %q", resp.Header.Get("WWW-Authenticate"))
				}
				if n := allSubscribers(s); n != 0 {
					t.Fatalf("a refused request subscribed (%d)", n)
				}
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("content type %q", ct)
			}
			cancel()
			resp.Body.Close()
			waitFor(t, "the unsubscribe", func() bool { return allSubscribers(s) == 0 })
		})
	}
}

func TestStreamHandlerKeepAlive(t *testing.T) {
	s := NewStreams()
	srv := httptest.NewServer(s.StreamHandler(StreamHandlerOptions{KeepAlive: 5 * time.Millisecond}))
	t.Cleanup(srv.Close)
	ctx := testCtx(t)
	_, r := openStream(ctx, t, srv.Client(), srv.URL+"/v1/streams/act")
	for i := range 2 {
		m, err := r.next()
		if err != nil {
			t.Fatal(err)
		}
		if m != (sseMsg{Comment: "keep-alive"}) {
			t.Fatalf("message %d of a silent stream: %+v, want a keep-alive comment", i, m)
		}
	}
	// Comments take no id: the first event is still number 1.
	s.forAttempt("act", 1).Delta("x")
	m, err := r.nextEvent()
	if err != nil {
		t.Fatal(err)
	}
	if want := (sseMsg{ID: "1", Event: "delta", Data: `{"attempt":1,"delta":"x"}`}); m != want {
		t.Fatalf("got %+v, want %+v", m, want)
	}
}

func TestStreamHandlerClientDisconnectUnsubscribes(t *testing.T) {
	s := NewStreams()
	h := s.StreamHandler(StreamHandlerOptions{KeepAlive: time.Hour})
	protocols(t, h, func(t *testing.T, base string, c *http.Client) {
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		resp, r := openStream(ctx, t, c, base+"/v1/streams/gone")
		s.forAttempt("gone", 1).Delta("a")
		if m, err := r.next(); err != nil || m.Event != "delta" {
			t.Fatalf("%+v %v", m, err)
		}
		if n := subscribers(s, "gone"); n != 1 {
			t.Fatalf("%d subscribers, want 1", n)
		}
		cancel()
		resp.Body.Close()
		waitFor(t, "the unsubscribe", func() bool { return subscribers(s, "gone") == 0 })
		// Publishing to an action nobody watches is a no-op.
		s.forAttempt("gone", 1).Delta("b")
	})
}

func TestStreamHandlerMethodAndPath(t *testing.T) {
	s := NewStreams()
	srv := httptest.NewServer(s.StreamHandler(StreamHandlerOptions{AuthToken: "t", KeepAlive: time.Hour}))
	t.Cleanup(srv.Close)
	ctx := testCtx(t)
	do := func(method, path string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer t")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, m := range []string{http.MethodPost, http.MethodHead, http.MethodPut, http.MethodDelete} {
		resp := do(m, "/v1/streams/act")
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodGet {
			t.Errorf("%s: status %d, Allow %q", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	for _, p := range []string{
		"/v1/streams/", "/v1/streams", "/v1/streams//act", "/v1/streams/act/",
		"/v1/streams/a/b", "/v2/streams/act", "/",
	} {
		if resp := do(http.MethodGet, p); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", p, resp.StatusCode)
		}
	}
	if n := allSubscribers(s); n != 0 {
		t.Fatalf("refused requests subscribed (%d)", n)
	}

	// A ref containing "/" travels path-escaped.
	ctx2, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx2, http.MethodGet, srv.URL+"/v1/streams/"+"team%2Fticket-7", nil)
	req.Header.Set("Authorization", "Bearer t")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || subscribers(s, "team/ticket-7") != 1 {
		t.Fatalf("escaped ref: status %d, subscribers %d", resp.StatusCode, subscribers(s, "team/ticket-7"))
	}
}

func TestStreamHandlerPrefix(t *testing.T) {
	s := NewStreams()
	srv := httptest.NewServer(s.StreamHandler(StreamHandlerOptions{Prefix: "llm/streams", KeepAlive: time.Hour}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	_, r := openStream(ctx, t, srv.Client(), srv.URL+"/llm/streams/act")
	s.forAttempt("act", 1).Delta("x")
	if m, err := r.next(); err != nil || m.Event != "delta" {
		t.Fatalf("%+v %v", m, err)
	}
	if resp := get(ctx, t, srv.Client(), srv.URL+"/v1/streams/act", ""); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("default prefix under a custom one: status %d", resp.StatusCode)
	}
}

func TestStreamHandlerNeedsFlusher(t *testing.T) {
	s := NewStreams()
	rec := httptest.NewRecorder()
	// Embedding the interface hides the recorder's Flush.
	w := struct{ http.ResponseWriter }{rec}
	s.StreamHandler(StreamHandlerOptions{}).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/streams/act", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", rec.Code)
	}
	if n := allSubscribers(s); n != 0 {
		t.Fatalf("subscribed without a stream (%d)", n)
	}
}

// expireOnCue replaces the handler's MaxDuration clock with a channel the
// test closes.
func expireOnCue(h *streamHandler) chan time.Time {
	end := make(chan time.Time)
	h.after = func(time.Duration) (<-chan time.Time, func() bool) { return end, func() bool { return true } }
	return end
}

func TestStreamHandlerMaxDurationEndsStream(t *testing.T) {
	s := NewStreams()
	h := s.streamHandler(StreamHandlerOptions{KeepAlive: time.Hour})
	end := expireOnCue(h)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx := testCtx(t)
	_, r := openStream(ctx, t, srv.Client(), srv.URL+"/v1/streams/act")
	s.forAttempt("act", 1).Delta("a")
	if m, err := r.next(); err != nil || m.Data != `{"attempt":1,"delta":"a"}` {
		t.Fatalf("%+v %v", m, err)
	}
	close(end)
	// Nothing was dropped, so no dropped event: just the end.
	if m, err := r.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after MaxDuration: %+v %v, want the end of the stream", m, err)
	}
	if n := subscribers(s, "act"); n != 0 {
		t.Fatalf("%d subscribers after MaxDuration", n)
	}
}

// smallBufferListener keeps the server's socket send buffer small (the
// test's dialer does the same for the client's receive buffer), so that a
// client that does not read blocks the handler after a small amount of
// data, whatever the host's TCP autotuning would allow.
type smallBufferListener struct{ net.Listener }

func (l smallBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	return c, err
}

func TestStreamHandlerSlowClientGetsDropped(t *testing.T) {
	s := NewStreams()
	h := s.streamHandler(StreamHandlerOptions{Buffer: 1, KeepAlive: time.Hour})
	end := expireOnCue(h)
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = smallBufferListener{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(16 << 10)
			}
			return conn, err
		},
	}}
	t.Cleanup(c.CloseIdleConnections)
	ctx := testCtx(t)
	_, r := openStream(ctx, t, c, srv.URL+"/v1/streams/slow")

	// The client reads nothing while 16 MiB are published: far more than
	// the socket buffers hold, so the handler blocks writing and all but a
	// few deltas find its one-slot subscription full.
	const n = 256
	pad := strings.Repeat("x", 64<<10)
	a := s.forAttempt("slow", 1)
	for i := range n {
		a.Delta(fmt.Sprintf("%04d", i) + pad)
	}
	close(end) // MaxDuration, with the client still there

	var deltas []int
	var last sseMsg
	for {
		m, err := r.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Comment != "" {
			t.Fatalf("unexpected comment %q", m.Comment)
		}
		if last.Event == "dropped" {
			t.Fatalf("event %+v after the dropped event", m)
		}
		if want := fmt.Sprint(len(deltas) + 1); m.ID != want {
			t.Fatalf("id %q, want %s", m.ID, want)
		}
		last = m
		if m.Event == "dropped" {
			continue
		}
		var d sseDelta
		if err := json.Unmarshal([]byte(m.Data), &d); err != nil || m.Event != "delta" || d.Attempt != 1 || len(d.Delta) != 4+len(pad) {
			t.Fatalf("event %s %.40q: %v", m.Event, m.Data, err)
		}
		var i int
		if _, err := fmt.Sscanf(d.Delta[:4], "%04d", &i); err != nil {
			t.Fatal(err)
		}
		if len(deltas) > 0 && i <= deltas[len(deltas)-1] {
			t.Fatalf("delta %d after delta %d", i, deltas[len(deltas)-1])
		}
		deltas = append(deltas, i)
	}
	if last.Event != "dropped" {
		t.Fatalf("the stream ended with %+v, want a dropped event", last)
	}
	var dr sseDropped
	if err := json.Unmarshal([]byte(last.Data), &dr); err != nil {
		t.Fatal(err)
	}
	if dr.Dropped <= 0 || len(deltas) == 0 {
		t.Fatalf("%d deltas delivered, %d dropped", len(deltas), dr.Dropped)
	}
	// Every delta is accounted for: delivered (what the subscription still
	// held at the end included) or counted as dropped.
	t.Logf("%d deltas delivered, %d dropped", len(deltas), dr.Dropped)
	if len(deltas)+dr.Dropped != n {
		t.Fatalf("%d delivered + %d dropped != %d published", len(deltas), dr.Dropped, n)
	}
	if n := subscribers(s, "slow"); n != 0 {
		t.Fatalf("%d subscribers after the stream ended", n)
	}
}
