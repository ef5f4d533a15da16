package providertest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The HTTP/1.1 side of the provider: a small server written on net.Conn
// (http.ReadRequest in, hand-written responses out) rather than on
// net/http's server, so that a fault is exactly the bytes a test asked
// for: a close after the request was read, a chunk cut in the middle, an
// idle keep-alive connection closed at a chosen moment.
//
// It serves the same behaviours as the HTTP/2 side, with the same
// ground truth ([Provider.Processed]). HTTP/1.1 has no GOAWAY and no
// RST_STREAM: the HTTP/2-only behaviours ([GoAwayAbove], [GoAwayAt],
// [RefuseStream], [ResetStream]) close the connection without answering
// (executed or not as their constructors say), and [HintsThenRefuse]
// sends 103 Early Hints and then closes. A cut ([StreamCut], [BodyCut])
// always ends a chunk in its middle and closes the connection, whatever
// the CutMode.

// ProtoHTTP11 and ProtoHTTP2 are the values of [Request.Proto] and
// [Record.Proto].
const (
	ProtoHTTP11 = "HTTP/1.1"
	ProtoHTTP2  = "HTTP/2.0"
)

// h1conn is one HTTP/1.1 connection.
type h1conn struct {
	p   *Provider
	idx int
	raw net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer

	mu   sync.Mutex
	idle bool // between requests: CloseIdleConns may close it
}

func (c *h1conn) setIdle(v bool) {
	c.mu.Lock()
	c.idle = v
	c.mu.Unlock()
}

// HTTP1URL returns the base URL of the cleartext HTTP/1.1 listener,
// "http://127.0.0.1:PORT".
func (p *Provider) HTTP1URL() string { return "http://" + p.h1Ln.Addr().String() }

// HTTP1TLSURL returns the base URL of the HTTP/1.1 TLS listener, which
// offers only "http/1.1" by ALPN (and serves a client that offers none),
// as most local model servers behind TLS do. It uses the same certificate
// as [Provider.URL].
func (p *Provider) HTTP1TLSURL() string { return "https://" + p.h1TLSLn.Addr().String() }

// CloseIdleConns closes every HTTP/1.1 connection that is idle between
// requests, as a server's keep-alive timeout does, and reports how many
// it closed. A connection in the middle of a request is left alone.
func (p *Provider) CloseIdleConns() int {
	p.mu.Lock()
	conns := make([]*h1conn, 0, len(p.h1conns))
	for c := range p.h1conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	n := 0
	for _, c := range conns {
		c.mu.Lock()
		if c.idle {
			// Closed under c.mu, so the connection cannot leave idle (a
			// request arriving) between the check and the close.
			_ = c.raw.Close()
			n++
		}
		c.mu.Unlock()
	}
	return n
}

// HTTP1ConnsOpen returns how many HTTP/1.1 connections are open.
func (p *Provider) HTTP1ConnsOpen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.h1conns)
}

// serveHTTP1 runs one accepted HTTP/1.1 socket to completion.
func (p *Provider) serveHTTP1(rc net.Conn, idx int, useTLS bool) {
	defer p.wg.Done()
	defer p.forget(rc)
	var nc net.Conn = rc
	if useTLS {
		tc, err := handshake(rc, p.serverTLS11)
		if err != nil {
			return
		}
		nc = tc
	}
	c := &h1conn{p: p, idx: idx, raw: rc, br: bufio.NewReader(nc), bw: bufio.NewWriter(nc)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.h1conns[c] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.h1conns, c)
		p.mu.Unlock()
	}()
	c.setIdle(true)
	for seq := 1; ; seq++ {
		req, err := http.ReadRequest(c.br)
		if err != nil {
			return
		}
		c.setIdle(false)
		if req.Method == "PRI" {
			// An HTTP/2 client's preface: answered as an HTTP/1.1-only
			// server does, 400 and a close; not a request, not recorded.
			_ = c.respond(http.StatusBadRequest, nil, []byte(errorBody("this server speaks HTTP/1.1", "invalid_request_error", "")), true)
			c.lingerClose()
			return
		}
		if !c.serveRequest(req, seq) {
			return
		}
	}
}

// lingerClose half-closes the connection and reads what the client still
// sends (the rest of an HTTP/2 preface, its first frames) for a moment
// before closing, as net/http's server does: closing with unread bytes
// would reset the connection and could destroy the answer just sent.
func (c *h1conn) lingerClose() {
	if tc, ok := c.raw.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_ = c.raw.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.Copy(io.Discard, c.br)
}

// serveRequest serves one request and reports whether the connection
// stays open for another.
func (c *h1conn) serveRequest(hr *http.Request, seq int) bool {
	p := c.p
	rec := &Record{
		ConnIndex: c.idx, Path: hr.URL.RequestURI(), Proto: ProtoHTTP11, ConnRequest: seq,
		IdempotencyKey: hr.Header.Get("Idempotency-Key"), AttemptID: hr.Header.Get("X-Durallm-Attempt"),
	}
	p.addReceived(rec)
	body, err := io.ReadAll(io.LimitReader(hr.Body, maxRequestBody+1))
	if err != nil {
		return false // the body never completed: no behaviour
	}
	if len(body) > maxRequestBody {
		p.updateRecord(rec, func(r *Record) { r.Behavior = BehaviorTooLarge })
		_ = c.respond(http.StatusRequestEntityTooLarge, nil, []byte(errorBody("request too large", "invalid_request_error", "")), true)
		return false
	}
	req := Request{
		ConnIndex: c.idx, Path: rec.Path, Method: hr.Method, Proto: ProtoHTTP11, ConnRequest: seq,
		IdempotencyKey: rec.IdempotencyKey, AttemptID: rec.AttemptID, Body: body, Header: hr.Header.Clone(),
	}
	parseBody(&req)
	b, done := p.take(&req)
	p.updateRecord(rec, func(r *Record) { r.Model, r.Stream, r.Behavior = req.Model, req.Stream, b.String() })
	if b.executed() {
		p.addProcessed(rec)
	}
	p.keep(&req, b)

	// While the behaviour waits, a close by the client must end the wait:
	// one read watches for it. The client sends nothing else before the
	// answer (no pipelining), so the read only returns on a close, and
	// serveHTTP1's next Peek finds whatever it read.
	gone := make(chan struct{})
	p.wg.Add(1)
	watched := make(chan struct{})
	go func() {
		defer p.wg.Done()
		defer close(watched)
		if _, err := c.br.Peek(1); err != nil {
			close(gone)
		}
	}()
	keep := c.act(req, b, gone) && !hr.Close
	done()
	if !keep {
		return false
	}
	// Idle until the next request's first byte (or a close) ends the
	// watching read.
	c.setIdle(true)
	<-watched
	c.setIdle(false)
	select {
	case <-gone:
		return false
	default:
		return true
	}
}

// act runs b and reports whether the connection may carry another request.
func (c *h1conn) act(req Request, b Behavior, gone <-chan struct{}) bool {
	if !b.pause(gone, c.p.closing) {
		return false
	}
	p := c.p
	switch b.kind {
	case kindDefault:
		return c.answer(req, Answer(defaultAnswer), gone)
	case kindAnswer:
		return c.answer(req, b, gone)
	case kindToolCall, kindAnswerOrCallTool:
		text, call := b.reply(req)
		if call != nil {
			return c.answerTool(req, call)
		}
		return c.answer(req, Answer(text), gone)
	case kindStatus:
		return c.respond(b.status, b.header, []byte(b.body), false) == nil
	case kindEmptyBody:
		return c.respond(http.StatusOK, nil, nil, false) == nil
	case kindNoChoices:
		return c.respond(http.StatusOK, nil, p.completionJSON(req, nil), false) == nil
	case kindHintsThenRefuse:
		_, _ = c.bw.WriteString("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
		_ = c.bw.Flush()
		return false
	case kindStreamStall:
		if c.sseChunks(b.chunks) {
			c.wait(gone)
		}
		return false
	case kindStreamCut:
		if c.sseChunks(b.chunks) {
			c.cutChunk(nil)
		}
		return false
	case kindBodyCut:
		if c.head(b.status, withType(b.header, "application/json"), -1, false) == nil {
			c.cutChunk([]byte(b.body))
		}
		return false
	case kindHold:
		c.wait(gone)
		return false
	case kindListStored:
		return c.respond(http.StatusOK, nil, p.storedList(req), false) == nil
	default:
		// CloseAfterRead, and the HTTP/2-only GOAWAY and RST_STREAM
		// behaviours: close without a byte of answer.
		return false
	}
}

func (c *h1conn) wait(gone <-chan struct{}) {
	select {
	case <-gone:
	case <-c.p.closing:
	}
}

// answer runs Answer (and AnswerThenClose, which sends Connection:
// close, and AnswerThenKeepOpen): chunked SSE if the request asked to
// stream, JSON with a Content-Length otherwise.
func (c *h1conn) answer(req Request, b Behavior, gone <-chan struct{}) bool {
	p, text, closeAfter := c.p, b.text, b.closeAfter
	if !req.Stream {
		return c.respond(http.StatusOK, nil, p.completionJSON(req, &text), closeAfter) == nil && !closeAfter
	}
	if c.head(http.StatusOK, sseHeader(), -1, closeAfter) != nil {
		return false
	}
	id, created := p.idFor(req), time.Now().Unix()
	for i, w := range splitWords(text) {
		if c.chunk(p.chunkEvent(id, created, w, i == 0)) != nil {
			return false
		}
	}
	stop := "stop"
	final := chatCompletion{
		ID: id, Object: "chat.completion.chunk", Created: created, Model: p.model,
		Choices: []choice{{Index: 0, Delta: &message{}, FinishReason: &stop}},
		Usage:   usageFor(req, text),
	}
	if c.chunk(append(sseEvent(mustJSON(final)), "data: [DONE]\n\n"...)) != nil {
		return false
	}
	if b.keepOpen {
		// No last chunk: the body ends only with the connection.
		keepOpen(gone, p.closing, func() error { return c.chunk([]byte(keepAliveComment)) })
		return false
	}
	_, _ = c.bw.WriteString("0\r\n\r\n")
	return c.bw.Flush() == nil && !closeAfter
}

// sseChunks starts a chunked SSE response and sends n content chunks,
// reporting whether all were written.
func (c *h1conn) sseChunks(n int) bool {
	if c.head(http.StatusOK, sseHeader(), -1, false) != nil {
		return false
	}
	p := c.p
	id, created := p.nextID(), time.Now().Unix()
	for i := range n {
		w := "chunk" + strconv.Itoa(i+1)
		if i > 0 {
			w = " " + w
		}
		if c.chunk(p.chunkEvent(id, created, w, i == 0)) != nil {
			return false
		}
	}
	return true
}

// cutChunk announces a chunk longer than data, sends data and stops: a
// chunked body cut in the middle of a chunk. The caller then closes.
func (c *h1conn) cutChunk(data []byte) {
	if len(data) == 0 {
		data = []byte(`data: {"id":"cut`)
	}
	fmt.Fprintf(c.bw, "%x\r\n", len(data)+64)
	_, _ = c.bw.Write(data)
	_ = c.bw.Flush()
}

func (c *h1conn) chunk(data []byte) error {
	fmt.Fprintf(c.bw, "%x\r\n", len(data))
	_, _ = c.bw.Write(data)
	_, _ = c.bw.WriteString("\r\n")
	return c.bw.Flush()
}

// respond writes a complete response with a Content-Length.
func (c *h1conn) respond(status int, header http.Header, body []byte, closeAfter bool) error {
	if err := c.head(status, withType(header, "application/json"), len(body), closeAfter); err != nil {
		return err
	}
	_, _ = c.bw.Write(body)
	return c.bw.Flush()
}

// head writes the status line and headers; length -1 means chunked.
func (c *h1conn) head(status int, header http.Header, length int, closeAfter bool) error {
	fmt.Fprintf(c.bw, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	keys := make([]string, 0, len(header))
	for k := range header {
		keys = append(keys, k)
	}
	slices.Sort(keys) // reproducible bytes on the wire
	for _, k := range keys {
		switch strings.ToLower(k) {
		case "content-length", "transfer-encoding", "connection":
			continue // the provider frames the body itself
		}
		for _, v := range header[k] {
			fmt.Fprintf(c.bw, "%s: %s\r\n", k, v)
		}
	}
	if length >= 0 {
		fmt.Fprintf(c.bw, "Content-Length: %d\r\n", length)
	} else {
		_, _ = c.bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if closeAfter {
		_, _ = c.bw.WriteString("Connection: close\r\n")
	}
	_, _ = c.bw.WriteString("\r\n")
	return c.bw.Flush()
}

func sseHeader() http.Header {
	return http.Header{"Content-Type": {"text/event-stream"}, "Cache-Control": {"no-cache"}}
}

// withType returns header with Content-Type set to typ unless it has one.
func withType(header http.Header, typ string) http.Header {
	h := header.Clone()
	if h == nil {
		h = make(http.Header)
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", typ)
	}
	return h
}
