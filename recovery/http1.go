package recovery

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durallm/durallm/evidence"
)

// The HTTP/1.1 half of the engine. It is its own small client over
// net.Conn (Request.Write to a bufio.Writer, http.ReadResponse from a
// bufio.Reader), not net/http.Transport, for two reasons:
//
//   - No hidden replay. net/http's transport re-sends a request on a new
//     connection when a reused one fails before any response byte and it
//     thinks the request replayable, which a request carrying
//     Idempotency-Key always is (every attempt carries one). This client
//     has no retry path at all.
//   - Exact evidence. A counting wrapper under the buffers sees every
//     byte the kernel accepted for the request and every byte that came
//     back, so "nothing was written" is a count, not a guess, and needs no
//     write barrier (contract section 3.4 is HTTP/2's problem).
//
// HTTP/1.1 has no last-stream id and no REFUSED_STREAM: once a request
// byte is written and no response comes, nothing proves the request was
// not processed, and the attempt is ambiguous. The pool therefore works to
// keep a request off a connection the server is about to close (the
// keep-alive race): idle connections are closed below common server
// keep-alive times (Config.HTTP1IdleTimeout), and a pooled connection is
// checked just before the write (h1Conn.alive): one the server already
// closed is discarded unwritten and a new one dialed.

// DefaultHTTP1IdleTimeout is Config.HTTP1IdleTimeout's default: below
// the 5 s keep-alive of uvicorn (vLLM), cpp-httplib (llama.cpp), Node.js
// and Apache, so the engine, not the server, closes an idle connection.
const DefaultHTTP1IdleTimeout = 4 * time.Second

// h1Conn is one HTTP/1.1 connection the engine owns. It carries one
// request at a time; between requests it sits in the idle pool.
type h1Conn struct {
	ref       string
	authority string
	raw       net.Conn   // the TCP connection, for the liveness check and for cutting it
	cc        *countConn // counts what crosses the plaintext side
	br        *bufio.Reader
	bw        *bufio.Writer
	tls       bool // the plaintext side is TLS
	idleSince time.Time
	idleGen   uint64 // bumped each time it enters the pool, so a stale expiry timer does nothing
}

// countConn counts the bytes the plaintext side of a connection accepted
// for writing and delivered on reading.
type countConn struct {
	net.Conn
	written atomic.Int64
	read    atomic.Int64
	// readErr is the first read error, so the caller can tell a server's
	// close (EOF, reset) from its own.
	mu      sync.Mutex
	readErr error
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(int64(n))
	if err != nil {
		c.mu.Lock()
		if c.readErr == nil {
			c.readErr = err
		}
		c.mu.Unlock()
	}
	return n, err
}

// serverClosed reports that a read ended because the server closed or
// reset the connection, rather than because the engine closed it.
func (c *countConn) serverClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr != nil && !errors.Is(c.readErr, net.ErrClosed)
}

func (c *h1Conn) close() { _ = c.raw.Close() }

// alive reports whether an idle connection can take a request: nothing
// is waiting to be read on it (neither a close, a reset, a TLS
// close_notify nor an unsolicited 408) and it is not closed. It never
// blocks.
func (c *h1Conn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	ok, known := peekIdle(c.raw)
	if known && !ok {
		return false
	}
	if c.tls {
		// The TLS layer may already hold a record read with the last
		// response (a close_notify sent right after it), which the socket
		// no longer shows. A read with a deadline in the past processes
		// what is buffered and touches the socket not at all; its timeout
		// does not break the TLS state.
		_ = c.cc.SetReadDeadline(time.Unix(1, 0))
		_, err := c.br.Peek(1)
		_ = c.cc.SetReadDeadline(time.Time{})
		if !isTimeout(err) {
			return false
		}
	}
	if known {
		return true
	}
	// No socket to peek at (a DialContext that returns its own net.Conn):
	// a read that times out at once is the next best check.
	_ = c.cc.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := c.br.Peek(1)
	_ = c.cc.SetReadDeadline(time.Time{})
	return isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// h1Pool keeps idle HTTP/1.1 connections, most recently used first, per
// pool key (scheme and authority). Connections in use are not in it.
type h1Pool struct {
	idleTimeout time.Duration
	maxIdle     int
	stats       *stats

	mu     sync.Mutex
	idle   map[string][]*h1Conn
	closed bool
}

// get takes the most recently used idle connection for key, or nil.
func (p *h1Pool) get(key string) *h1Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		list := p.idle[key]
		if len(list) == 0 {
			return nil
		}
		c := list[len(list)-1]
		list[len(list)-1] = nil
		p.idle[key] = list[:len(list)-1]
		c.idleGen++
		if time.Since(c.idleSince) < p.idleTimeout {
			return c
		}
		// Its expiry timer has not run yet: the same decision.
		p.stats.h1Expired.Add(1)
		go c.close()
	}
}

// put returns a connection whose last response was read completely and
// that may be reused. It reports false (and closes c) when it is not
// kept.
func (p *h1Pool) put(key string, c *h1Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.idleTimeout <= 0 || len(p.idle[key]) >= p.maxIdle {
		go c.close()
		return false
	}
	c.idleSince = time.Now()
	c.idleGen++
	gen := c.idleGen
	p.idle[key] = append(p.idle[key], c)
	time.AfterFunc(p.idleTimeout, func() { p.expire(key, c, gen) })
	return true
}

// expire closes c if it is still idle since the put that armed this timer.
func (p *h1Pool) expire(key string, c *h1Conn, gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.idleGen != gen {
		return
	}
	list := p.idle[key]
	for i, ic := range list {
		if ic == c {
			p.idle[key] = append(list[:i], list[i+1:]...)
			p.stats.h1Expired.Add(1)
			go c.close()
			return
		}
	}
}

func (p *h1Pool) closeAll() {
	p.mu.Lock()
	p.closed = true
	all := p.idle
	p.idle = map[string][]*h1Conn{}
	p.mu.Unlock()
	for _, list := range all {
		for _, c := range list {
			c.close()
		}
	}
}

// dialHTTP1 opens a connection for HTTP/1.1: TCP, then TLS offering only
// http/1.1 for https.
func (e *Engine) dialHTTP1(ctx context.Context, scheme, authority string) (*h1Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	raw, err := e.cfg.DialContext(dctx, "tcp", authority)
	if err != nil {
		return nil, fmt.Errorf("recovery: dial %s: %w", authority, err)
	}
	if scheme != "https" {
		return e.newH1Conn(raw, raw, authority), nil
	}
	tc := tls.Client(raw, e.tlsConfig(authority, []string{"http/1.1"}))
	if err := tc.HandshakeContext(dctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("recovery: TLS handshake with %s: %w", authority, err)
	}
	return e.newH1Conn(raw, tc, authority), nil
}

func (e *Engine) newH1Conn(raw, plain net.Conn, authority string) *h1Conn {
	cc := &countConn{Conn: plain}
	e.stats.connsOpened.Add(1)
	e.stats.h1Opened.Add(1)
	return &h1Conn{
		ref: e.proc + "-c" + strconv.FormatUint(e.seq.Add(1), 10), authority: authority,
		raw: raw, cc: cc, tls: plain != raw, br: bufio.NewReaderSize(cc, 16<<10), bw: bufio.NewWriterSize(cc, 16<<10),
	}
}

// errNegotiatedHTTP1 is what the HTTP/2 dial returns, for an auto route
// over TLS, when ALPN chose http/1.1 (or nothing): the connection is good,
// for HTTP/1.1. RoundTrip takes it over.
type errNegotiatedHTTP1 struct{ c *h1Conn }

func (errNegotiatedHTTP1) Error() string { return "recovery: ALPN chose HTTP/1.1" }

// roundTripHTTP1 sends out once over HTTP/1.1. adopted is a connection
// already dialed for this request (ALPN chose http/1.1), nil to take one
// from the pool or dial.
func (e *Engine) roundTripHTTP1(ctx context.Context, a *Attempt, out *http.Request, scheme, authority string, auto bool, adopted *h1Conn) (*http.Response, error) {
	key := scheme + "://" + authority
	if ctx.Err() != nil {
		// Ended before anything was picked: nothing is written, and a
		// connection dialed for it stays good for the next request.
		if adopted != nil {
			e.h1.put(key, adopted)
		}
		a.settle(ctx, context.Cause(ctx), auto)
		return nil, &AttemptError{AttemptID: a.spec.AttemptID, Err: context.Cause(ctx)}
	}
	c, dialed := adopted, adopted != nil
	if c == nil && !a.spec.FreshConnection {
		for c = e.h1.get(key); c != nil; c = e.h1.get(key) {
			if slices.Contains(a.spec.Avoid, c.ref) {
				c.close()
				continue
			}
			if c.alive() {
				break
			}
			// The server closed it while it was idle (its keep-alive
			// timer beat ours): it was never written to, so a new
			// connection is not a retry.
			e.stats.h1ClosedIdle.Add(1)
			c.close()
		}
	}
	if c == nil {
		var err error
		if c, err = e.dialHTTP1(ctx, scheme, authority); err != nil {
			a.dialFailed(ctx)
			a.settle(ctx, nil, auto)
			return nil, &AttemptError{AttemptID: a.spec.AttemptID, Err: err}
		}
		dialed = true
	} else if !dialed {
		e.stats.h1Reused.Add(1)
	}
	a.useHTTP1(c, dialed)

	// A context that ends cuts the connection: that unblocks any write or
	// read, and the counts stay exact (a write returns what the kernel
	// took before the close).
	stop := context.AfterFunc(ctx, c.close)
	fail := func(err error) (*http.Response, error) {
		stop()
		c.close()
		a.settle(ctx, err, auto)
		return nil, &AttemptError{AttemptID: a.spec.AttemptID, Err: err}
	}
	w0, r0 := c.cc.written.Load(), c.cc.read.Load()
	err := out.Write(c.bw)
	if err == nil {
		err = c.bw.Flush()
	}
	a.http1Written(c.cc.written.Load() - w0)
	if err != nil {
		// A write the connection refused: it is closed or reset.
		a.http1Failed(ctx, true, false)
		return fail(err)
	}
	resp, err := readResponse(c.br, out)
	if err != nil {
		got := c.cc.read.Load() - r0
		a.http1Failed(ctx, c.cc.serverClosed(), got > 0)
		if errors.Is(err, errHTTP2Answer) {
			a.mismatch(evidence.MismatchHTTP2)
			e.unlearnHTTP1(scheme, authority)
			err = fmt.Errorf("%w (%w)", ErrSpeaksOnlyHTTP2, err)
		} else if got == 0 && !dialed && ctx.Err() == nil {
			// The keep-alive race lost: the request went out on a reused
			// connection the server closed with no answer. HTTP/1.1
			// cannot prove it unprocessed: ambiguous, and counted.
			e.stats.h1RaceLost.Add(1)
		}
		return fail(err)
	}
	a.response(resp)
	a.http1Headers()
	tracker := &eofReader{rc: resp.Body, cut: c.close}
	reuse := !resp.Close && !out.Close
	if resp.StatusCode == http.StatusMisdirectedRequest {
		// Quarantined: this connection cannot serve this authority, so it
		// goes back to no one.
		reuse = false
		e.stats.quarantines.Add(1)
	}
	resp.Body = &body{rc: tracker, a: a, ctx: ctx, auto: auto, release: func() {
		// Only a body read to its end leaves the connection at a message
		// boundary; stop reports false once the context has cut it.
		if stop() && reuse && tracker.eof.Load() {
			e.h1.put(key, c)
			return
		}
		c.close()
	}}
	return resp, nil
}

// errHTTP2Answer: the first bytes of the answer were an HTTP/2 frame.
var errHTTP2Answer = errors.New("recovery: the server answered HTTP/1.1 with HTTP/2 (an h2c-only server)")

// readResponse reads the final response to req, skipping 1xx
// informational responses (101 is not expected: the engine never asks to
// upgrade). It recognises an HTTP/2 server's SETTINGS frame, which is what
// an h2c-only server sends to a request it cannot parse.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if b, err := br.Peek(9); err == nil && looksLikeSettingsFrame(b) {
		return nil, errHTTP2Answer
	}
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
		resp.Body.Close()
	}
}

// looksLikeSettingsFrame reports whether b starts with an HTTP/2 SETTINGS
// frame header on stream 0 (RFC 9113 section 6.5), a server's first frame.
func looksLikeSettingsFrame(b []byte) bool {
	return len(b) >= 9 && b[3] == frameSettings && b[5]|b[6]|b[7]|b[8] == 0 && b[0] == 0
}

// eofReader remembers that its reader reached a clean end, and cuts the
// connection when the body is closed before it.
type eofReader struct {
	rc  io.ReadCloser
	cut func()
	// eof is atomic: Close may come from another goroutine than Read.
	eof atomic.Bool
}

func (r *eofReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	if err == io.EOF {
		r.eof.Store(true)
	}
	return n, err
}

// Close closes the body. Before its end it first cuts the connection, as
// x/net's reset does for HTTP/2: net/http's body would read the rest, and
// a server that keeps a finished stream open never ends it. The cut is the
// caller's choice, so the error of the inner close, which finds the
// connection cut, is not one.
func (r *eofReader) Close() error {
	if r.eof.Load() {
		return r.rc.Close()
	}
	r.cut()
	_ = r.rc.Close()
	return nil
}

// The attempt's HTTP/1.1 facts. The engine records them as they happen;
// settle does not overwrite them with frame facts.

func (a *Attempt) useHTTP1(c *h1Conn, dialed bool) {
	a.mu.Lock()
	a.http1, a.h1, a.h1Written0 = true, c.cc, c.cc.written.Load()
	a.ev.ConnRef, a.ev.ConnFresh, a.ev.HTTPVersion = c.ref, dialed, evidence.ProtoHTTP11
	a.mu.Unlock()
}

func (a *Attempt) http1Written(n int64) {
	a.mu.Lock()
	a.ev.RequestBytes += n
	a.ev.RequestSent = a.ev.RequestBytes > 0
	a.mu.Unlock()
}

// http1Failed records how the exchange failed before a response: whether
// the connection was closed or reset (while the context was live, so it
// was not the engine cutting it) and whether any answer byte came.
func (a *Attempt) http1Failed(ctx context.Context, closed, answered bool) {
	a.mu.Lock()
	a.ev.ConnClosed = ctx.Err() == nil && closed
	a.ev.ResponseHeaders = a.ev.ResponseHeaders || answered
	a.mu.Unlock()
}

func (a *Attempt) http1Headers() {
	a.mu.Lock()
	a.ev.ResponseHeaders = true
	a.mu.Unlock()
}

func (a *Attempt) mismatch(speaks string) {
	a.mu.Lock()
	a.ev.ProtocolMismatch = speaks
	a.mu.Unlock()
}
