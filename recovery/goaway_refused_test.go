package recovery_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// goAwayHold follows the frames an HTTP/2 server sends and, once armed,
// holds the GOAWAY until release: it is still on its way to the client
// while the client sends its next request.
type goAwayHold struct {
	hdr  [9]byte
	hdrN int
	skip uint32 // payload bytes of the current frame still to come

	mu      sync.Mutex
	armed   bool
	held    chan struct{}
	release chan struct{}
}

// pass is called with each chunk from the server before it is passed on.
func (g *goAwayHold) pass(b []byte) {
	sawGoAway := false
	for p := b; len(p) > 0; {
		if g.skip > 0 {
			k := min(int(g.skip), len(p))
			g.skip -= uint32(k)
			p = p[k:]
			continue
		}
		k := copy(g.hdr[g.hdrN:], p)
		g.hdrN += k
		p = p[k:]
		if g.hdrN == len(g.hdr) {
			g.hdrN = 0
			g.skip = uint32(g.hdr[0])<<16 | uint32(g.hdr[1])<<8 | uint32(g.hdr[2])
			sawGoAway = sawGoAway || g.hdr[3] == 0x7
		}
	}
	g.mu.Lock()
	hold := g.armed && sawGoAway
	if hold {
		g.armed = false
	}
	held, release := g.held, g.release
	g.mu.Unlock()
	if hold {
		close(held)
		<-release
	}
}

func (g *goAwayHold) arm() (held <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.held, g.release = true, make(chan struct{}), make(chan struct{})
	rel := g.release
	return g.held, func() { close(rel) }
}

// startTLSRelay accepts cleartext HTTP/2 (h2c) on a free loopback port and
// relays each connection to target over TLS (ALPN h2), passing what the
// server sends through hold: the test sees the frames in the clear, and
// the server sees an ordinary TLS HTTP/2 client.
func startTLSRelay(t *testing.T, target string, roots *x509.CertPool, hold *goAwayHold) string {
	t.Helper()
	return serveLoopback(t, nil, func(c net.Conn) {
		up, err := tls.Dial("tcp", target, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
		if err != nil {
			return
		}
		defer up.Close()
		go func() {
			_, _ = io.Copy(up, c)
			_ = up.CloseWrite()
		}()
		buf := make([]byte, 32<<10)
		for {
			n, err := up.Read(buf)
			if n > 0 {
				hold.pass(buf[:n])
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
}

// crossTheGoAway makes a server's GOAWAY cross the client's next
// request, and checks that the stream it refused is refused and that the
// answer in flight below the boundary arrives. server is the address of
// an HTTP/2 TLS server in front of p (or p itself) and goAway makes it
// send its GOAWAY while the first request is held at p.
//
// The engine speaks h2c to a relay in front of server (startTLSRelay),
// which holds the GOAWAY on its way to the client until the next request
// is on the wire: the server ignores that stream, and x/net, once it
// reads the GOAWAY, aborts the stream and writes RST_STREAM(CANCEL) for
// it, which the engine must keep off the wire.
func crossTheGoAway(t *testing.T, p *providertest.Provider, server string, goAway func() error) {
	t.Helper()
	hold := &goAwayHold{}
	relay := startTLSRelay(t, server, p.CertPool(), hold)
	e := recovery.New(recovery.Config{Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	h := &harness{t: t, p: p, e: e}
	ctx := recovery.WithHTTPVersion(t.Context(), recovery.HTTPVersion2)
	url := "http://" + relay

	answer := make(chan struct{})
	p.Push(providertest.Answer("the answer below the boundary").WaitFor(answer))
	below := make(chan result, 1)
	go func() { below <- h.send(ctx, recovery.Spec{IdempotencyKey: "k-below"}, url, false, nil) }()
	waitFor(t, func() bool { return p.ExecutedCount("k-below") == 1 })

	held, release := hold.arm()
	sent := make(chan error, 1)
	go func() { sent <- goAway() }()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the server sent no GOAWAY")
	}
	a := recovery.NewAttempt(recovery.Spec{IdempotencyKey: "k-above"})
	above := make(chan result, 1)
	go func() {
		var r result
		req, err := http.NewRequestWithContext(recovery.WithAttempt(ctx, a), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		if err == nil {
			var resp *http.Response
			if resp, err = e.RoundTrip(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				r.body = string(b)
			}
		}
		r.err = err
		r.ev, r.c = a.Finish(evidence.SignalNone)
		above <- r
	}()
	waitFor(t, a.OnTheWire)
	release()

	ra := <-above
	h.want(ra, evidence.Refused)
	h.wantReason(ra, "goaway_above_boundary")
	if ra.ev.StreamID != 3 {
		t.Fatalf("the request above the boundary went on stream %d, not the draining connection's 3: %+v", ra.ev.StreamID, ra.ev)
	}
	// x/net now writes its RST_STREAM for stream 3: either it is dropped,
	// or it reaches the server, which then cuts the answer below.
	waitFor(t, func() bool { return e.Stats().RefusedStreamFramesDropped > 0 || len(below) == 1 })
	close(answer)
	rb := <-below
	h.want(rb, evidence.Completed)
	if rb.body == "" || rb.ev.ConnRef != ra.ev.ConnRef {
		t.Fatalf("below: %+v body %q", rb.ev, rb.body)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	h.executed("k-below", 1)
	h.executed("k-above", 0)
}

// Go's HTTP/2 server before Go 1.20 (and Caddy 2.6 as Debian builds it)
// reads an RST_STREAM for a stream that crossed its GOAWAY as a protocol
// error on an idle stream and closes the connection, with the answers of
// the streams at or below the boundary still in flight. x/net's client
// sends exactly that RST_STREAM(CANCEL) when it aborts the refused
// stream, so the answer below the boundary was lost (ambiguous) although
// the server had executed it. The engine now keeps every frame for a
// stream a received GOAWAY refused off the wire: the stream above is
// refused, the one below completes, and each executed as the server says.
func TestAnRSTForAStreamTheGoAwayRefusedIsNeverSent(t *testing.T) {
	p, err := providertest.NewProvider(providertest.WithStrictIdleStreams())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	crossTheGoAway(t, p, strings.TrimPrefix(p.URL(), "https://"), func() error {
		p.Drain(http2.ErrCodeNo)
		return nil
	})
}
