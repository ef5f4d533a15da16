package recovery_test

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// readHoldConn delays what the server sends: once armed, the next read
// that returns data waits until release. It stands in for a GOAWAY still
// on its way to the client while the client sends another request.
type readHoldConn struct {
	net.Conn
	mu      sync.Mutex
	armed   bool
	held    chan struct{}
	release chan struct{}
}

func (c *readHoldConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	hold := c.armed && n > 0
	if hold {
		c.armed = false
	}
	held, release := c.held, c.release
	c.mu.Unlock()
	if hold {
		close(held)
		<-release
	}
	return n, err
}

// arm holds the next read with data; held is closed once one is held.
func (c *readHoldConn) arm() (held <-chan struct{}, release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.held, c.release = true, make(chan struct{}), make(chan struct{})
	rel := c.release
	return c.held, func() { close(rel) }
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
	var mu sync.Mutex
	var conns []*readHoldConn
	e := recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			hc := &readHoldConn{Conn: c}
			mu.Lock()
			conns = append(conns, hc)
			mu.Unlock()
			return hc, nil
		}})
	defer e.Close()
	h := &harness{t: t, p: p, e: e}

	answer := make(chan struct{})
	p.Push(providertest.Answer("the answer below the boundary").WaitFor(answer))
	below := make(chan result, 1)
	go func() { below <- h.send(t.Context(), recovery.Spec{IdempotencyKey: "k-below"}, p.URL(), false, nil) }()
	waitFor(t, func() bool { return p.ExecutedCount("k-below") == 1 })

	// The server drains (GOAWAY, last-stream id 1) while the client, which
	// has not read the GOAWAY yet, sends its next request on stream 3.
	mu.Lock()
	hc := conns[0]
	mu.Unlock()
	held, release := hc.arm()
	p.Drain(http2.ErrCodeNo)
	<-held
	above := make(chan result, 1)
	go func() { above <- h.send(t.Context(), recovery.Spec{IdempotencyKey: "k-above"}, p.URL(), false, nil) }()
	waitFor(t, func() bool {
		for _, r := range p.Received() {
			if r.IdempotencyKey == "k-above" && r.Behavior == providertest.BehaviorIgnored {
				return true
			}
		}
		return false
	})
	release()

	ra := <-above
	h.want(ra, recovery.Refused)
	h.wantReason(ra, "goaway_above_boundary")
	if ra.ev.StreamID != 3 {
		t.Fatalf("the request above the boundary went on stream %d, not the draining connection's 3: %+v", ra.ev.StreamID, ra.ev)
	}
	// x/net now writes its RST_STREAM for stream 3: either it is dropped,
	// or it reaches the server, which then cuts the answer below.
	waitFor(t, func() bool { return e.Stats().RefusedStreamFramesDropped > 0 || len(below) == 1 })
	close(answer)
	rb := <-below
	h.want(rb, recovery.Completed)
	if rb.body == "" || rb.ev.ConnRef != ra.ev.ConnRef {
		t.Fatalf("below: %+v body %q", rb.ev, rb.body)
	}
	h.executed("k-below", 1)
	h.executed("k-above", 0)
}
