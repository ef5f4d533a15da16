package providertest

import (
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// h1Client is a plain net/http HTTP/1.1 client that trusts p.
func h1Client(p *Provider) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.CertPool(), ServerName: "127.0.0.1"}}}
}

func h1Post(t *testing.T, c *http.Client, url, body string) (*http.Response, []byte, error) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", "k")
	return roundTrip(c.Transport, req)
}

func TestHTTP1AnswerKeepsTheConnectionAlivePlainAndTLS(t *testing.T) {
	p := newTestProvider(t)
	for _, url := range []string{p.HTTP1URL(), p.HTTP1TLSURL()} {
		p.Reset()
		c := h1Client(p)
		for i := range 2 {
			resp, b, err := h1Post(t, c, url, `{"model":"m"}`)
			if err != nil || resp.StatusCode != 200 || resp.ProtoMajor != 1 || !strings.Contains(string(b), `"content":"ok"`) {
				t.Fatalf("%s #%d: %v %v %s", url, i, err, resp, b)
			}
		}
		recs := p.Processed()
		if len(recs) != 2 || recs[0].Proto != ProtoHTTP11 || recs[1].ConnRequest != 2 || recs[0].ConnIndex != recs[1].ConnIndex {
			t.Fatalf("%s: records %+v", url, recs)
		}
	}
}

func TestHTTP1StreamIsChunkedSSE(t *testing.T) {
	p := newTestProvider(t)
	p.Push(Answer("two words"))
	resp, b, err := h1Post(t, h1Client(p), p.HTTP1URL(), `{"model":"m","stream":true}`)
	if err != nil || resp.Header.Get("Content-Type") != "text/event-stream" || len(resp.TransferEncoding) != 1 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("%v %+v %q", err, resp, b)
	}
}

func TestHTTP1StreamCutEndsMidChunk(t *testing.T) {
	p := newTestProvider(t)
	p.Push(StreamCut(1, CutReset))
	_, b, err := h1Post(t, h1Client(p), p.HTTP1URL(), `{"model":"m","stream":true}`)
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(string(b), "chunk1") {
		t.Fatalf("err %v body %q", err, b)
	}
	if p.ExecutedCount("k") != 1 {
		t.Fatalf("executed %d", p.ExecutedCount("k"))
	}
}

func TestHTTP1AnswerThenCloseSaysConnectionClose(t *testing.T) {
	p := newTestProvider(t)
	p.Push(AnswerThenClose("bye"))
	resp, b, err := h1Post(t, h1Client(p), p.HTTP1URL(), `{"model":"m"}`)
	if err != nil || !resp.Close || !strings.Contains(string(b), "bye") {
		t.Fatalf("%v close=%v %s", err, resp != nil && resp.Close, b)
	}
	waitFor(t, "condition", func() bool { return p.HTTP1ConnsOpen() == 0 })
}

func TestHTTP1CloseIdleConnsClosesOnlyIdleOnes(t *testing.T) {
	p := newTestProvider(t)
	c := h1Client(p)
	if _, _, err := h1Post(t, c, p.HTTP1URL(), `{}`); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	p.Push(Answer("held").WaitFor(release))
	busy := make(chan error, 1)
	go func() {
		_, _, err := h1Post(t, h1Client(p), p.HTTP1URL(), `{}`)
		busy <- err
	}()
	waitFor(t, "condition", func() bool { return len(p.Processed()) == 2 })
	waitFor(t, "condition", func() bool { return p.CloseIdleConns() == 1 })
	close(release)
	if err := <-busy; err != nil {
		t.Fatalf("the busy connection was closed: %v", err)
	}
}

func TestHTTP1CloseAfterReadAnswersNothing(t *testing.T) {
	p := newTestProvider(t)
	p.Push(CloseAfterRead())
	tr := &http.Transport{DisableKeepAlives: true}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.HTTP1URL()+"/v1/chat/completions", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k")
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("got a response")
	}
	if p.ExecutedCount("k") != 1 {
		t.Fatalf("executed %d", p.ExecutedCount("k"))
	}
}
