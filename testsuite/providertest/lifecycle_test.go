package providertest

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

func TestDrainWithBareTransport(t *testing.T) {
	p := newTestProvider(t)
	tr := h2cTransport(t)
	gate := make(chan struct{})
	p.Push(Answer("in flight").WaitFor(gate))

	type result struct {
		body string
		err  error
	}
	first := make(chan result, 1)
	go func() {
		_, body, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "a-first"))
		first <- result{string(body), err}
	}()
	waitFor(t, "first request executing", func() bool { return p.AttemptExecutions("a-first") == 1 })

	p.Drain(http2.ErrCodeNo)
	// Whether or not the client has read the GOAWAY yet, this request ends
	// up on a new connection: either the pool already dropped the
	// draining one, or the provider ignores the new stream and the client
	// retries it elsewhere.
	resp, _, err := roundTrip(tr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "a-second"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("request after Drain: %v", err)
	}
	recs := p.Processed()
	if len(recs) != 2 || recs[1].AttemptID != "a-second" || recs[1].ConnIndex == recs[0].ConnIndex {
		t.Errorf("Processed = %+v, want the second request on a new connection", recs)
	}

	close(gate)
	if r := <-first; r.err != nil || !strings.Contains(r.body, "in flight") {
		t.Fatalf("in-flight request across Drain: %v %q", r.err, r.body)
	}
	waitFor(t, "drained connection to close", func() bool { return p.ConnsOpen() == 1 })
	if n := p.AttemptExecutions("a-first"); n != 1 {
		t.Errorf("in-flight request executed %d times", n)
	}
}

func TestCloseWithStalledStreamIsPrompt(t *testing.T) {
	p, err := NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	tr := tlsTransport(t, p)
	p.Push(StreamStall(1))
	resp, err := tr.RoundTrip(chatReq(t, testCtx(t), p.URL(), true, "", "stall"))
	if err != nil {
		_ = p.Close()
		t.Fatalf("RoundTrip: %v", err)
	}
	defer resp.Body.Close()
	sr := sseReader{bufio.NewReader(resp.Body)}
	if _, err := sr.next(); err != nil {
		t.Fatalf("first chunk: %v", err)
	}

	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not return with a stalled stream")
	}
	if _, err := sr.next(); err == nil {
		t.Error("stream still readable after Close")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, _, err := roundTrip(h2cTransport(t), chatReq(t, testCtx(t), p.H2CURL(), false, "", "")); err == nil {
		t.Error("request after Close succeeded")
	}
}

// providerGoroutines lists goroutines running provider code.
func providerGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "providertest.(*Provider).") || strings.Contains(g, "providertest.(*conn).") {
			out = append(out, g)
		}
	}
	return out
}

func TestNoGoroutineLeakAfterClose(t *testing.T) {
	before := runtime.NumGoroutine()
	p, err := NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	tlsTr := &http2.Transport{TLSClientConfig: p.ClientTLSConfig()}
	h2cTr := h2cTransport(t)

	// Leave every kind of long-lived state behind: held, delayed and
	// stalled streams, a GOAWAY bound timer, an idle connection, a TCP
	// connection that never sends a preface and one that never finishes
	// a TLS handshake.
	p.Script(func(r Request) (Behavior, bool) {
		switch r.AttemptID {
		case "hold":
			return Hold(), true
		case "delay":
			return Answer("x").After(time.Hour), true
		case "stall":
			return StreamStall(2), true
		}
		return Behavior{}, false
	})
	var wg sync.WaitGroup
	for _, a := range []string{"hold", "delay", "stall"} {
		for _, tr := range []*http2.Transport{tlsTr, h2cTr} {
			base := p.URL()
			if tr == h2cTr {
				base = p.H2CURL()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := tr.RoundTrip(chatReq(t, testCtx(t), base, true, "", a))
				if err == nil {
					_, _ = bufio.NewReader(resp.Body).ReadString(0) // blocks until Close
					resp.Body.Close()
				}
			}()
		}
	}
	waitFor(t, "requests executing", func() bool { return len(p.Processed()) == 6 })
	p.Push(GoAwayAbove(http2.ErrCodeNo))
	// A separate transport, so its retry does not disturb h2cTr. Whether
	// the retry succeeds does not matter here, only what it leaves behind.
	goawayTr := &http2.Transport{AllowHTTP: true, DialTLSContext: h2cTr.DialTLSContext}
	_, _, _ = roundTrip(goawayTr, chatReq(t, testCtx(t), p.H2CURL(), false, "", "goaway"))
	silent, err := net.Dial("tcp", strings.TrimPrefix(p.H2CURL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	noHandshake, err := net.Dial("tcp", strings.TrimPrefix(p.URL(), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	defer noHandshake.Close()
	waitFor(t, "all connections accepted", func() bool { return p.ConnsAccepted() >= 6 })

	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Close has waited for every goroutine's wg.Done, which is the last
	// thing each does; poll (bounded) for the exits that follow it.
	deadline := time.Now().Add(testTimeout)
	for gs := providerGoroutines(); len(gs) != 0; gs = providerGoroutines() {
		if time.Now().After(deadline) {
			t.Fatalf("provider goroutines survive Close:\n%s", strings.Join(gs, "\n\n"))
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	tlsTr.CloseIdleConnections()
	h2cTr.CloseIdleConnections()
	goawayTr.CloseIdleConnections()
	_ = silent.Close()
	_ = noHandshake.Close()
	deadline = time.Now().Add(testTimeout)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d before, %d after Close", before, runtime.NumGoroutine())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFiftyConcurrentRequestsOneConnection(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			p := newTestProvider(t)
			var tr *http2.Transport
			base := p.H2CURL()
			if useTLS {
				tr, base = tlsTransport(t, p), p.URL()
			} else {
				tr = h2cTransport(t)
			}
			// Establish the connection first, so the 50 share it.
			if _, _, err := roundTrip(tr, chatReq(t, testCtx(t), base, false, "", "warmup")); err != nil {
				t.Fatal(err)
			}
			p.SetDefault(Answer("lorem ipsum dolor sit amet"))
			const n = 50
			errs := make(chan error, n)
			for i := range n {
				go func() {
					attempt := fmt.Sprintf("c-%d", i)
					resp, body, err := roundTrip(tr, chatReq(t, testCtx(t), base, i%2 == 0, "", attempt))
					switch {
					case err != nil:
						errs <- fmt.Errorf("%s: %w", attempt, err)
					case resp.StatusCode != 200 || !strings.Contains(string(body), "lorem"):
						errs <- fmt.Errorf("%s: status %d, %d bytes", attempt, resp.StatusCode, len(body))
					default:
						errs <- nil
					}
				}()
			}
			for range n {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			if got := p.ConnsAccepted(); got != 1 {
				t.Errorf("ConnsAccepted = %d, want 1", got)
			}
			for i := range n {
				if got := p.AttemptExecutions(fmt.Sprintf("c-%d", i)); got != 1 {
					t.Errorf("c-%d executed %d times", i, got)
				}
			}
		})
	}
}
