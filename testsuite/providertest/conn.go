package providertest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

const (
	// maxWindow is the largest flow-control window HTTP/2 allows.
	maxWindow = 1<<31 - 1
	// initialWindow is the RFC 9113 default for both connection and stream
	// windows, in force until the client's SETTINGS says otherwise.
	initialWindow = 65535
	// defaultMaxFrame is the RFC default SETTINGS_MAX_FRAME_SIZE. We never
	// advertise more, so we also refuse to read larger frames.
	defaultMaxFrame = 16384
	// headerTableSize is the default HPACK dynamic table size; we keep it.
	headerTableSize = 4096
	// maxHeaderList bounds a decoded request header list. Far above any
	// real request, far below what would hurt the test process.
	maxHeaderList = 1 << 20
	// maxRequestBody bounds how much request body one stream may buffer.
	maxRequestBody = 64 << 20
	// closeWriteTimeout bounds how long a graceful close waits for a write
	// blocked on a client that stopped reading.
	closeWriteTimeout = time.Second
	// lingerTimeout bounds how long a closing connection keeps reading after
	// our side is shut, waiting for the client to close its side.
	lingerTimeout = time.Second
	// goAwayCloseBound is the longest a connection stays open after a
	// GOAWAY behaviour, even if streams at or below the last-stream-id
	// never finish.
	goAwayCloseBound = 2 * time.Second
)

var (
	errStreamDone  = errors.New("providertest: stream ended")
	errConnClosing = errors.New("providertest: connection closing")
)

// connError is a connection error found while processing a frame; the
// read loop answers it with GOAWAY and closes the connection.
type connError struct {
	code   http2.ErrCode
	reason string
}

func (e connError) Error() string {
	return fmt.Sprintf("providertest: connection error %s: %s", e.code, e.reason)
}

// stream is one client-initiated stream the provider accepted.
type stream struct {
	id   uint32
	rec  *Record
	req  Request       // headers part; the body is added when complete
	done chan struct{} // closed once the stream is over, for any reason

	// Guarded by conn.mu.
	closed     bool
	sendWindow int64

	// Owned by the read loop.
	body     bytes.Buffer
	bodyDone bool
}

// isDone reports whether the stream is over, without locking.
func (st *stream) isDone() bool {
	select {
	case <-st.done:
		return true
	default:
		return false
	}
}

// conn is one HTTP/2 connection. A single read loop goroutine reads and
// dispatches frames; each stream with a complete request runs its
// behaviour on its own goroutine.
//
// Lock order: wmu, then mu, then Provider.mu. Nothing takes wmu while
// holding mu, so a writer blocked on the network can never stall the read
// loop's window bookkeeping.
type conn struct {
	p       *Provider
	index   int
	raw     net.Conn      // the TCP socket: deadlines, half-close, hard close
	tlsConn *tls.Conn     // nil on the h2c listener
	br      *bufio.Reader // buffered reader under the framer; also reads the preface
	nc      net.Conn      // what the framer writes to (TLS or TCP), for a write of several frames at once
	fr      *http2.Framer
	done    chan struct{} // closed when the connection has been torn down

	// wmu serialises frame writes and owns the HPACK encoder, so header
	// blocks reach the wire in the order they were encoded and the
	// client's dynamic table matches ours.
	wmu     sync.Mutex
	hbuf    bytes.Buffer
	henc    *hpack.Encoder
	wclosed bool // our sending side is shut

	mu                sync.Mutex
	cond              *sync.Cond // window changes and stream/connection ends
	streams           map[uint32]*stream
	maxClientID       uint32 // highest stream id the client has used
	maxAccepted       uint32 // highest stream id we accepted to serve
	goAwaySent        bool
	goAwayLast        uint32
	peerGoAway        bool
	closing           bool // no new work; streams have been ended
	graceful          bool // closing with a half-close and a linger
	sendWindow        int64
	peerInitialWindow int64
	peerMaxFrame      uint32
}

func newConn(p *Provider, idx int, raw net.Conn, tc *tls.Conn, nc net.Conn) *conn {
	c := &conn{
		p:                 p,
		index:             idx,
		raw:               raw,
		tlsConn:           tc,
		nc:                nc,
		done:              make(chan struct{}),
		streams:           make(map[uint32]*stream),
		sendWindow:        initialWindow,
		peerInitialWindow: initialWindow,
		peerMaxFrame:      defaultMaxFrame,
	}
	c.cond = sync.NewCond(&c.mu)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.br = bufio.NewReaderSize(nc, 16<<10)
	c.fr = http2.NewFramer(nc, c.br)
	c.fr.SetMaxReadFrameSize(defaultMaxFrame)
	c.fr.MaxHeaderListSize = maxHeaderList
	// With ReadMetaHeaders set, the framer joins HEADERS and CONTINUATION
	// and decodes the block with this connection's one HPACK decoder.
	c.fr.ReadMetaHeaders = hpack.NewDecoder(headerTableSize, nil)
	return c
}

// serve runs the connection: preface, SETTINGS, then the read loop.
func (c *conn) serve() {
	defer c.teardown()
	_ = c.raw.SetReadDeadline(time.Now().Add(handshakeTimeout))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.br, preface); err != nil || string(preface) != http2.ClientPreface {
		// Not HTTP/2 (or not prior-knowledge h2c): there is no peer that
		// would understand a GOAWAY, so just hang up.
		return
	}
	_ = c.raw.SetReadDeadline(time.Time{})
	err := c.writeConn(func() error {
		return c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.p.maxStreams},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
		)
	})
	if err != nil {
		return
	}
	// Register only now: Drain's GOAWAY must never precede our SETTINGS,
	// which RFC 9113 §3.4 requires to be the first frame we send.
	if !c.p.addConn(c) {
		return
	}
	c.readLoop()
}

// readLoop reads and dispatches frames until the connection ends.
func (c *conn) readLoop() {
	for {
		f, err := c.fr.ReadFrame()
		if c.isClosing() {
			break
		}
		if err != nil {
			if c.onReadError(err) {
				continue
			}
			break
		}
		if err := c.processFrame(f); err != nil {
			var ce connError
			if errors.As(err, &ce) {
				c.fail(ce)
			}
			break
		}
	}
	c.linger()
}

// onReadError handles an error from ReadFrame and reports whether the
// connection survives it.
func (c *conn) onReadError(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) {
		c.mu.Lock()
		// A rejected HEADERS still opened (and so closed) its stream id:
		// later frames for it must be seen as on a closed stream.
		if se.StreamID%2 == 1 && se.StreamID > c.maxClientID {
			c.maxClientID = se.StreamID
		}
		c.mu.Unlock()
		c.resetStream(se.StreamID, se.Code)
		return true
	}
	var ce http2.ConnectionError
	if errors.As(err, &ce) {
		reason := "protocol error"
		if d := c.fr.ErrorDetail(); d != nil {
			reason = d.Error()
		}
		c.fail(connError{code: http2.ErrCode(ce), reason: reason})
		return false
	}
	if errors.Is(err, http2.ErrFrameTooLarge) {
		c.fail(connError{code: http2.ErrCodeFrameSize, reason: "frame larger than SETTINGS_MAX_FRAME_SIZE"})
		return false
	}
	// EOF, a reset, a deadline or a closed socket: nothing to tell the
	// client.
	return false
}

// processFrame dispatches one frame. A connError return means the client
// broke the protocol; any other error means the connection is unusable.
func (c *conn) processFrame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		return c.writeConn(func() error { return c.fr.WritePing(true, f.Data) })
	case *http2.RSTStreamFrame:
		return c.onRSTStream(f)
	case *http2.GoAwayFrame:
		// The client will open no more streams; finish the ones in flight
		// and then close, as a server does after its own GOAWAY.
		c.mu.Lock()
		c.peerGoAway = true
		c.mu.Unlock()
		c.maybeClose()
		return nil
	case *http2.PriorityFrame:
		// RFC 9113 deprecates stream priorities; ignoring them is correct.
		return nil
	case *http2.PushPromiseFrame:
		return connError{code: http2.ErrCodeProtocol, reason: "client sent PUSH_PROMISE"}
	default:
		// Unknown (extension) frame types must be ignored (RFC 9113 §4.1).
		return nil
	}
}

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	var tableSize *uint32
	c.mu.Lock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			// The change applies to every open stream's window, which may
			// go negative (RFC 9113 §6.9.2) but never above the maximum.
			delta := int64(s.Val) - c.peerInitialWindow
			for _, st := range c.streams {
				st.sendWindow += delta
				if st.sendWindow > maxWindow {
					return http2.ConnectionError(http2.ErrCodeFlowControl)
				}
			}
			c.peerInitialWindow = int64(s.Val)
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = s.Val
		case http2.SettingHeaderTableSize:
			v := s.Val
			tableSize = &v
		}
		return nil
	})
	c.cond.Broadcast()
	c.mu.Unlock()
	if err != nil {
		var ce http2.ConnectionError
		if errors.As(err, &ce) {
			return connError{code: http2.ErrCode(ce), reason: "invalid SETTINGS value"}
		}
		return connError{code: http2.ErrCodeProtocol, reason: "invalid SETTINGS"}
	}
	return c.writeConn(func() error {
		// The encoder must honour a smaller table before we acknowledge,
		// and both happen under wmu so no header block slips in between.
		if tableSize != nil {
			c.henc.SetMaxDynamicTableSizeLimit(*tableSize)
		}
		return c.fr.WriteSettingsAck()
	})
}

func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return connError{code: http2.ErrCodeProtocol, reason: "HEADERS on a server-initiated stream id"}
	}
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		c.mu.Unlock()
		// A second header block on an open stream is a trailer block,
		// which must end the request.
		switch {
		case st.bodyDone:
			c.resetStream(id, http2.ErrCodeStreamClosed)
		case !f.StreamEnded():
			c.resetStream(id, http2.ErrCodeProtocol)
		default:
			c.completeBody(st)
		}
		return nil
	}
	if id <= c.maxClientID {
		c.mu.Unlock()
		// A stream we already ended (reset, abandoned, ignored): trailers
		// may legitimately still arrive, and dropping them keeps the
		// connection usable for the client's other streams.
		return nil
	}
	c.maxClientID = id
	method, path := f.PseudoValue("method"), f.PseudoValue("path")
	if method == "" || path == "" || f.Truncated {
		c.mu.Unlock()
		c.resetStream(id, http2.ErrCodeProtocol)
		return nil
	}
	hdr := make(http.Header)
	for _, hf := range f.RegularFields() {
		hdr.Add(http.CanonicalHeaderKey(hf.Name), hf.Value)
	}
	rec := &Record{
		ConnIndex:      c.index,
		StreamID:       id,
		Proto:          ProtoHTTP2,
		Path:           path,
		IdempotencyKey: hdr.Get("Idempotency-Key"),
		AttemptID:      hdr.Get("X-Durallm-Attempt"),
	}
	var st *stream
	switch {
	case c.closing || (c.goAwaySent && id > c.goAwayLast):
		// RFC 9113 §6.8: after GOAWAY, streams above the last-stream-id
		// are ignored; the client knows they were not processed.
		rec.Behavior = BehaviorIgnored
	case uint32(len(c.streams)) >= c.p.maxStreams:
		rec.Behavior = BehaviorOverLimit
	default:
		st = &stream{
			id:   id,
			rec:  rec,
			done: make(chan struct{}),
			req: Request{
				ConnIndex:      c.index,
				StreamID:       id,
				Proto:          ProtoHTTP2,
				Path:           path,
				Method:         method,
				IdempotencyKey: rec.IdempotencyKey,
				AttemptID:      rec.AttemptID,
				Header:         hdr,
			},
			sendWindow: c.peerInitialWindow,
		}
		c.streams[id] = st
		c.maxAccepted = id
	}
	c.mu.Unlock()
	c.p.addReceived(rec)
	if st == nil {
		if rec.Behavior == BehaviorOverLimit {
			return c.writeConn(func() error { return c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
		}
		return nil
	}
	if f.StreamEnded() {
		c.completeBody(st)
	}
	return nil
}

func (c *conn) onData(f *http2.DataFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return connError{code: http2.ErrCodeProtocol, reason: "DATA on a server-initiated stream id"}
	}
	// The whole payload, padding included, counts against flow control.
	// Hand the credit back at once: the client counts it against the
	// connection window even for streams we no longer track, and a large
	// request body must never stall.
	if n := f.Length; n > 0 {
		if err := c.writeConn(func() error { return c.fr.WriteWindowUpdate(0, n) }); err != nil {
			return err
		}
	}
	c.mu.Lock()
	st := c.streams[id]
	idle := id > c.maxClientID
	c.mu.Unlock()
	if st == nil {
		if idle {
			return connError{code: http2.ErrCodeProtocol, reason: "DATA on an idle stream"}
		}
		return nil
	}
	if st.bodyDone {
		c.resetStream(id, http2.ErrCodeStreamClosed)
		return nil
	}
	data := f.Data()
	if st.body.Len()+len(data) > maxRequestBody {
		c.p.updateRecord(st.rec, func(r *Record) { r.Behavior = BehaviorTooLarge })
		c.resetStream(id, http2.ErrCodeEnhanceYourCalm)
		return nil
	}
	st.body.Write(data) // copies: the framer reuses its read buffer
	if f.StreamEnded() {
		c.completeBody(st)
		return nil
	}
	if n := f.Length; n > 0 {
		return c.writeConn(func() error { return c.fr.WriteWindowUpdate(id, n) })
	}
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	c.mu.Lock()
	if f.StreamID == 0 {
		c.sendWindow += inc
		over := c.sendWindow > maxWindow
		c.cond.Broadcast()
		c.mu.Unlock()
		if over {
			return connError{code: http2.ErrCodeFlowControl, reason: "connection window above 2^31-1"}
		}
		return nil
	}
	st := c.streams[f.StreamID]
	if st == nil {
		idle := f.StreamID%2 == 0 || f.StreamID > c.maxClientID || c.refusedIdleLocked(f.StreamID)
		c.mu.Unlock()
		if idle {
			return connError{code: http2.ErrCodeProtocol, reason: "WINDOW_UPDATE on an idle stream"}
		}
		return nil
	}
	st.sendWindow += inc
	over := st.sendWindow > maxWindow
	c.cond.Broadcast()
	c.mu.Unlock()
	if over {
		c.resetStream(f.StreamID, http2.ErrCodeFlowControl)
	}
	return nil
}

func (c *conn) onRSTStream(f *http2.RSTStreamFrame) error {
	id := f.StreamID
	c.mu.Lock()
	if id%2 == 0 || id > c.maxClientID || c.refusedIdleLocked(id) {
		c.mu.Unlock()
		return connError{code: http2.ErrCodeProtocol, reason: "RST_STREAM on an idle stream"}
	}
	if st := c.streams[id]; st != nil {
		// Ending the stream wakes its handler, which abandons the
		// response without writing another frame.
		c.closeStreamLocked(st)
	}
	c.mu.Unlock()
	c.maybeClose()
	return nil
}

// refusedIdleLocked reports that id is a stream a strict provider
// (WithStrictIdleStreams) counts as never opened: above the last-stream id
// of the GOAWAY it sent. c.mu must be held.
func (c *conn) refusedIdleLocked(id uint32) bool {
	return c.p.strictIdle && c.goAwaySent && id > c.goAwayLast
}

// completeBody hands a stream whose request is complete to a handler.
// It runs on the read loop, which is what makes the choice of behaviour
// follow the order in which requests complete on a connection.
func (c *conn) completeBody(st *stream) {
	st.bodyDone = true
	c.mu.Lock()
	gone := st.closed
	c.mu.Unlock()
	if gone {
		// Abandoned by a GOAWAY another stream's handler just sent: it
		// must not use up a queued behaviour meant for a live request.
		c.p.updateRecord(st.rec, func(r *Record) { r.Behavior = BehaviorIgnored })
		return
	}
	req := st.req
	req.Body = bytes.Clone(st.body.Bytes())
	st.body = bytes.Buffer{}
	parseBody(&req)
	b, done := c.p.take(&req)
	c.p.updateRecord(st.rec, func(r *Record) {
		r.Model = req.Model
		r.Stream = req.Stream
		r.Behavior = b.String()
	})
	c.p.wg.Add(1)
	go c.runStream(st, req, b, done)
}

// isClosing reports whether the connection has stopped taking work.
func (c *conn) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// closeStreamLocked ends st and forgets it. c.mu must be held.
func (c *conn) closeStreamLocked(st *stream) {
	if !st.closed {
		st.closed = true
		close(st.done)
	}
	if c.streams[st.id] == st {
		delete(c.streams, st.id)
	}
	c.cond.Broadcast()
}

// endStream is called when a stream's handler is finished with it.
func (c *conn) endStream(st *stream) {
	c.mu.Lock()
	c.closeStreamLocked(st)
	c.mu.Unlock()
	c.maybeClose()
}

// resetStream ends stream id (if open) and sends RST_STREAM.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		c.closeStreamLocked(st)
	}
	c.mu.Unlock()
	_ = c.writeConn(func() error { return c.fr.WriteRSTStream(id, code) })
	c.maybeClose()
}

// maybeClose closes the connection once a GOAWAY (ours or the client's)
// has been exchanged and no stream is left in flight.
func (c *conn) maybeClose() {
	c.mu.Lock()
	idle := !c.closing && (c.goAwaySent || c.peerGoAway) && len(c.streams) == 0
	c.mu.Unlock()
	if idle {
		c.closeGracefully()
	}
}

// fail answers a client protocol violation: GOAWAY with the error code,
// then close.
func (c *conn) fail(ce connError) {
	c.goAway(0, true, ce.code, goAwayDebug+": "+ce.reason)
	c.closeGracefully()
}

// goAway sends GOAWAY with last-stream-id last (or, with useAccepted, the
// highest stream id accepted so far) and abandons every stream above it:
// those are never answered. A later GOAWAY never raises the id, as RFC
// 9113 §6.8 requires.
//
// With more codes, one GOAWAY per code follows the first, all with the
// same last-stream-id and all in a single write, so a client reads them
// together: nothing it does between the frames can hide the first one.
func (c *conn) goAway(last uint32, useAccepted bool, code http2.ErrCode, debug string, more ...http2.ErrCode) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if c.closing || c.wclosed {
		c.mu.Unlock()
		return
	}
	if useAccepted {
		last = c.maxAccepted
	}
	if c.goAwaySent && last > c.goAwayLast {
		last = c.goAwayLast
	}
	c.goAwaySent = true
	c.goAwayLast = last
	// Ending the streams under wmu means no frame of theirs can be
	// written after the GOAWAY that disowns them.
	for id, st := range c.streams {
		if id > last {
			c.closeStreamLocked(st)
		}
	}
	c.mu.Unlock()
	if len(more) == 0 {
		if err := c.fr.WriteGoAway(last, code, []byte(debug)); err != nil {
			_ = c.raw.Close()
		}
		return
	}
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	for _, code := range append([]http2.ErrCode{code}, more...) {
		// Writing into a bytes.Buffer cannot fail.
		_ = fr.WriteGoAway(last, code, []byte(debug))
	}
	if _, err := c.nc.Write(buf.Bytes()); err != nil {
		_ = c.raw.Close()
	}
}

// closeAfter closes the connection gracefully after d unless it is gone
// by then.
func (c *conn) closeAfter(d time.Duration) {
	defer c.p.wg.Done()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		c.closeGracefully()
	case <-c.done:
	}
}

// closeGracefully ends every stream and shuts our sending side (TLS
// close_notify, then a TCP FIN). The read loop then drains the socket
// until the client closes or lingerTimeout passes. Closing with unread
// input would make the kernel send RST, which can destroy a GOAWAY we just
// wrote before the client reads it.
func (c *conn) closeGracefully() {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.closing = true
	c.graceful = true
	for _, st := range c.streams {
		c.closeStreamLocked(st)
	}
	c.mu.Unlock()

	// A writer blocked on a client that stopped reading holds wmu; the
	// deadline frees it.
	_ = c.raw.SetWriteDeadline(time.Now().Add(closeWriteTimeout))
	c.wmu.Lock()
	c.wclosed = true
	if c.tlsConn != nil {
		_ = c.tlsConn.CloseWrite()
	}
	if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	c.wmu.Unlock()
	// Also wakes the read loop if it is blocked in ReadFrame.
	_ = c.raw.SetReadDeadline(time.Now().Add(lingerTimeout))
}

// linger drains the socket after a graceful close; see closeGracefully.
func (c *conn) linger() {
	c.mu.Lock()
	graceful := c.graceful
	c.mu.Unlock()
	if graceful {
		_, _ = io.Copy(io.Discard, c.raw)
	}
}

// teardown runs when the read loop exits: every stream ends, every
// waiter wakes, and the socket closes.
func (c *conn) teardown() {
	c.mu.Lock()
	c.closing = true
	for _, st := range c.streams {
		c.closeStreamLocked(st)
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	_ = c.raw.Close()
	c.p.removeConn(c)
	close(c.done)
}

// writeConn writes connection-level frames.
func (c *conn) writeConn(fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(fn)
}

// writeStream writes frames for st unless st is over. The check happens
// under wmu, so a stream abandoned by a GOAWAY cannot write after it.
func (c *conn) writeStream(st *stream, fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if st.isDone() {
		return errStreamDone
	}
	return c.writeLocked(fn)
}

// writeLocked runs fn with wmu held.
func (c *conn) writeLocked(fn func() error) error {
	if c.wclosed {
		return errConnClosing
	}
	if err := fn(); err != nil {
		// A failed or partial write leaves the framing and HPACK state
		// unknown: the connection cannot be used any further.
		_ = c.raw.Close()
		return fmt.Errorf("providertest: write frame: %w", err)
	}
	return nil
}

// writeHeaders encodes and writes a response header block for st,
// splitting it into CONTINUATION frames beyond the client's frame size.
func (c *conn) writeHeaders(st *stream, fields []hpack.HeaderField, endStream bool) error {
	return c.writeStream(st, func() error {
		c.hbuf.Reset()
		for _, hf := range fields {
			// Writing into a bytes.Buffer cannot fail.
			_ = c.henc.WriteField(hf)
		}
		c.mu.Lock()
		maxFrame := int(c.peerMaxFrame)
		c.mu.Unlock()
		block := c.hbuf.Bytes()
		first := block[:min(len(block), maxFrame)]
		rest := block[len(first):]
		err := c.fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID:      st.id,
			BlockFragment: first,
			EndStream:     endStream,
			EndHeaders:    len(rest) == 0,
		})
		for err == nil && len(rest) > 0 {
			frag := rest[:min(len(rest), maxFrame)]
			rest = rest[len(frag):]
			err = c.fr.WriteContinuation(st.id, len(rest) == 0, frag)
		}
		return err
	})
}

// writeData writes p on st as DATA frames within the client's
// flow-control windows and frame size, waiting for WINDOW_UPDATE as
// needed. With end set, the last frame carries END_STREAM.
func (c *conn) writeData(st *stream, p []byte, end bool) error {
	for {
		if len(p) == 0 {
			if !end {
				return nil
			}
			// An empty DATA frame is not flow-controlled.
			return c.writeStream(st, func() error { return c.fr.WriteData(st.id, true, nil) })
		}
		n, err := c.reserve(st, len(p))
		if err != nil {
			return err
		}
		chunk, last := p[:n], end && n == len(p)
		if err := c.writeStream(st, func() error { return c.fr.WriteData(st.id, last, chunk) }); err != nil {
			// The stream is dead; give the connection window back so the
			// other streams keep their share.
			c.mu.Lock()
			c.sendWindow += int64(n)
			c.cond.Broadcast()
			c.mu.Unlock()
			return err
		}
		p = p[n:]
		if last {
			return nil
		}
	}
}

// reserve waits until both windows are open and takes up to want bytes
// of them, at most one frame's worth.
func (c *conn) reserve(st *stream, want int) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if st.closed || c.closing {
			return 0, errStreamDone
		}
		if c.sendWindow > 0 && st.sendWindow > 0 {
			n := min(int64(want), c.sendWindow, st.sendWindow, int64(c.peerMaxFrame))
			c.sendWindow -= n
			st.sendWindow -= n
			return int(n), nil
		}
		// Woken by WINDOW_UPDATE, SETTINGS, and by any stream or
		// connection ending, so a reset or Close never leaves us here.
		c.cond.Wait()
	}
}
