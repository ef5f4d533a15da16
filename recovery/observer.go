package recovery

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/durallm/durallm/evidence"
)

// HTTP/2 frame types and flags the observer reads (RFC 9113 section 6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	frameContinuation = 0x9

	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20
)

const (
	clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	// maxHeaderBlock bounds one outgoing header block the observer
	// buffers to decode. A block above it loses the mapping rather than
	// memory.
	maxHeaderBlock = 1 << 20
	// maxDecoderTable is the largest hpack dynamic table update the
	// decoder accepts; x/net's encoder defaults to 4096.
	maxDecoderTable = 1 << 16
)

var attemptHeaderLower = strings.ToLower(HeaderAttemptID)

// http1StatusPrefix begins every HTTP/1.x status line.
const http1StatusPrefix = "HTTP/1."

// errObserverLost marks a connection whose frames could not be followed.
var errObserverLost = errors.New("recovery: frame observer lost the connection's framing")

// Observer maps requests to HTTP/2 streams by watching the frames on the
// connections it wraps. One Observer serves many connections, so a request
// re-sent on another connection is still seen as the same attempt
// (Evidence.TransportReplays).
//
// The engine uses one internally. It is exported so the same evidence can
// be collected under any HTTP/2 client: wrap each connection the client
// dials with WrapConn, Track the attempt id before sending a request that
// carries HeaderAttemptID, and read the Stream snapshot after.
//
// An Observer is safe for concurrent use.
type Observer struct {
	mu       sync.Mutex
	attempts map[string]*tracker
}

// NewObserver returns an Observer with no tracked attempts.
func NewObserver() *Observer {
	return &Observer{attempts: make(map[string]*tracker)}
}

// tracker is what the observer knows of one attempt's stream(s).
//
// Lock order: ObservedConn.mu, then tracker.mu (bind and the frame
// callbacks run under the connection's lock and take the tracker's).
// Untrack therefore never holds tracker.mu while it takes a connection's.
type tracker struct {
	mu       sync.Mutex
	gone     bool      // untracked: bind must not attach it to a stream any more
	bindings []binding // every (connection, stream) entry that points at it, for Untrack to remove
	// bindBuf backs bindings for the usual single stream, so binding it
	// allocates nothing.
	bindBuf     [1]binding
	conn        *ObservedConn // the connection that carried its latest stream
	streams     int
	streamID    uint32
	reqBytes    int64
	respHeaders bool
	rst         *evidence.ErrCode
	// afterGoAway: a stream of this attempt left on a connection that had
	// already received GOAWAY.
	afterGoAway bool
}

// Track starts watching for attemptID. It must be called before the
// request's HEADERS are written; frames for an untracked id are ignored.
func (o *Observer) Track(attemptID string) { o.track(attemptID, nil) }

// track is Track with the tracker's storage given: the engine passes
// one inside its Attempt, which it allocates anyway. t must be unused
// (zero) and is not used when attemptID is already tracked; nil means a
// new one.
func (o *Observer) track(attemptID string, t *tracker) {
	o.mu.Lock()
	if _, ok := o.attempts[attemptID]; !ok {
		if t == nil {
			t = &tracker{}
		}
		o.attempts[attemptID] = t
	}
	o.mu.Unlock()
}

// binding is one entry of a connection's stream map.
type binding struct {
	conn   *ObservedConn
	stream uint32
}

// Untrack forgets attemptID; frames for it that arrive later are ignored.
// It also removes the attempt's streams from their connections' maps, so
// a long-lived connection holds entries only for attempts in flight.
func (o *Observer) Untrack(attemptID string) {
	if t := o.remove(attemptID); t != nil {
		t.mu.Lock()
		bs := t.goneLocked()
		t.mu.Unlock()
		unbind(t, bs)
	}
}

// remove takes attemptID out of the tracked set and returns its tracker.
func (o *Observer) remove(attemptID string) *tracker {
	o.mu.Lock()
	t := o.attempts[attemptID]
	delete(o.attempts, attemptID)
	o.mu.Unlock()
	return t
}

// goneLocked marks t untracked and returns its bindings, for unbind to
// remove once t.mu is released. Marking it gone first closes the race
// with a bind already past its lookup: bind checks gone under t.mu, so
// either it sees gone and adds nothing, or its binding is in the list
// returned here.
func (t *tracker) goneLocked() []binding {
	t.gone = true
	bs := t.bindings
	t.bindings = nil
	return bs
}

// unbind removes t's bindings from their connections' stream maps. It
// takes each connection's lock, so t.mu must not be held (lock order).
func unbind(t *tracker, bs []binding) {
	for _, b := range bs {
		b.conn.mu.Lock()
		if b.conn.streams[b.stream] == t {
			delete(b.conn.streams, b.stream)
		}
		b.conn.mu.Unlock()
	}
}

func (o *Observer) lookup(attemptID string) *tracker {
	o.mu.Lock()
	t := o.attempts[attemptID]
	o.mu.Unlock()
	return t
}

// StreamFacts is a snapshot of what the frames said about one attempt.
type StreamFacts struct {
	// ConnRef is the connection that carried the latest stream, empty if
	// none did.
	ConnRef string
	// StreamID is the latest stream that carried the attempt, 0 if none.
	StreamID uint32
	// Streams counts streams that carried the attempt; above 1 is a replay.
	Streams int
	// RequestBytes counts HEADERS and DATA payload sent on those streams.
	RequestBytes int64
	// ResponseHeaders reports a HEADERS frame from the server on the stream.
	ResponseHeaders bool
	// RSTStream is the code of a server RST_STREAM on the stream, or nil.
	RSTStream *evidence.ErrCode
	// GoAway is what the GOAWAYs on the stream's connection said together
	// (lowest last-stream id, first non-NO_ERROR code), or nil.
	GoAway *evidence.GoAway
	// ConnClosed reports that the stream's connection has ended.
	ConnClosed bool
	// MappingLost reports that the stream's connection could not be
	// followed, so the facts above are incomplete.
	MappingLost bool
	// SentAfterGoAway reports that a stream of the attempt left on a
	// connection that had already received GOAWAY.
	SentAfterGoAway bool
	// AnsweredHTTP1 reports that the server's first bytes on the
	// connection were an HTTP/1.x status line: it read the HTTP/2 preface
	// as an HTTP/1 request and answered it, so it speaks HTTP/1.1.
	AnsweredHTTP1 bool
	// ServerSilent reports that the server closed or reset the connection
	// (seen by a read or by a refused write) without having sent a single
	// byte.
	ServerSilent bool
}

// Stream returns what the frames said about attemptID so far. When no
// stream carried it yet, conn-level facts come from fallback (the
// connection the caller chose), which may be nil.
func (o *Observer) Stream(attemptID string, fallback *ObservedConn) StreamFacts {
	return o.facts(attemptID, fallback, false)
}

// final is Stream followed by Untrack, for the end of an exchange, in one
// pass: one lookup in the tracked set and one hold of the tracker's lock
// instead of two of each. The facts are the tracker's as it is marked
// gone, so no frame can change them in between either.
func (o *Observer) final(attemptID string, fallback *ObservedConn) StreamFacts {
	return o.facts(attemptID, fallback, true)
}

// facts is Stream, and with untrack also Untrack.
func (o *Observer) facts(attemptID string, fallback *ObservedConn, untrack bool) StreamFacts {
	var f StreamFacts
	c := fallback
	var t *tracker
	if untrack {
		t = o.remove(attemptID)
	} else {
		t = o.lookup(attemptID)
	}
	if t != nil {
		t.mu.Lock()
		c = t.factsLocked(&f, c)
		var bs []binding
		if untrack {
			bs = t.goneLocked()
		}
		t.mu.Unlock()
		unbind(t, bs)
	}
	c.connFacts(&f)
	return f
}

// factsLocked copies the tracker's facts into f and returns the
// connection whose facts complete them: the one that carried the latest
// stream, else c. t.mu must be held.
func (t *tracker) factsLocked(f *StreamFacts, c *ObservedConn) *ObservedConn {
	f.StreamID, f.Streams, f.RequestBytes, f.ResponseHeaders = t.streamID, t.streams, t.reqBytes, t.respHeaders
	f.SentAfterGoAway = t.afterGoAway
	if t.rst != nil {
		code := *t.rst
		f.RSTStream = &code
	}
	if t.conn != nil {
		return t.conn
	}
	return c
}

// connFacts adds the connection-level facts of c, which may be nil, to f.
func (c *ObservedConn) connFacts(f *StreamFacts) {
	if c == nil {
		return
	}
	f.ConnRef = c.ref
	c.mu.Lock()
	if c.goAway != nil {
		g := *c.goAway
		f.GoAway = &g
	}
	closed := c.closed.Load()
	f.ConnClosed, f.MappingLost = closed, c.lost
	f.AnsweredHTTP1 = c.http1Answer
	f.ServerSilent = c.inTotal == 0 && ((closed && c.peerClosed) || c.peerGone)
	c.mu.Unlock()
}

// ConnHooks are called by an ObservedConn from its read path, before the
// HTTP/2 client sees the frame. They must not block.
type ConnHooks struct {
	// GoAway is called for every GOAWAY the server sends.
	GoAway func(evidence.GoAway)
	// Lost is called once when the observer loses the framing.
	Lost func()
	// Closed is called once when the connection's read side ends.
	Closed func()
	// Dropped is called from the write path with the number of frames the
	// connection kept off the wire because a GOAWAY had refused their
	// stream (ObservedConn.Write).
	Dropped func(frames int)
}

// WrapConn wraps the plaintext side of an HTTP/2 client connection (a
// *tls.Conn after the handshake, or a TCP conn for h2c) so the observer
// sees every frame. ref names the connection in evidence. The wrapper keeps
// the TLS connection state visible to the HTTP/2 client.
func (o *Observer) WrapConn(c net.Conn, ref string, hooks ConnHooks) net.Conn {
	_, outer := o.wrap(c, ref, hooks)
	return outer
}

// wrap returns the observed connection and the net.Conn to hand to the
// HTTP/2 client (which also exposes the TLS state when c is TLS).
func (o *Observer) wrap(c net.Conn, ref string, hooks ConnHooks) (*ObservedConn, net.Conn) {
	oc := &ObservedConn{
		Conn:    c,
		obs:     o,
		ref:     ref,
		hooks:   hooks,
		streams: make(map[uint32]*tracker),
		out:     parser{preface: len(clientPreface)},
		gate:    outGate{preface: len(clientPreface)},
		changed: make(chan struct{}),
	}
	// 4096 is the table size HTTP/2 starts with (SETTINGS_HEADER_TABLE_SIZE).
	oc.dec = newAttemptDecoder(attemptHeaderLower, 4096, maxDecoderTable)
	if tc, ok := c.(*tls.Conn); ok {
		return oc, &observedTLSConn{ObservedConn: oc, tls: tc}
	}
	return oc, oc
}

// ObservedConn is a net.Conn whose HTTP/2 frames are watched. Reads pass
// through unchanged; so do writes, except the frames for a stream that a
// GOAWAY received on the connection has refused (see Write).
type ObservedConn struct {
	net.Conn
	obs   *Observer
	ref   string
	hooks ConnHooks

	// mu guards everything below. Writes are serialized by the HTTP/2
	// client and reads come from its one read loop, so contention is two
	// goroutines at most.
	mu      sync.Mutex
	out     parser // client → server
	in      parser // server → client
	gate    outGate
	dec     *attemptDecoder
	inBlock bool                // a header block is being collected
	block   []byte              // the block so far; its array is reused
	blockOn uint32              // its stream id
	streams map[uint32]*tracker // streams of tracked attempts (Untrack removes them)
	goAway  *evidence.GoAway    // every GOAWAY received so far, merged (mergeGoAway)
	// closed: the read side has ended. Written under mu with peerClosed,
	// but atomic so that isClosed, which the pool asks for every
	// connection on every pick, need not take mu: mu is the lock the
	// connection's read loop and writer take for every frame, so taking
	// it from the requesting goroutine moved its cache line between
	// cores twice per pick.
	closed atomic.Bool
	lost   bool
	// pingsOut counts outgoing PING frames (the engine's write barrier,
	// Engine.neverLeft). changed is closed and replaced when pingsOut
	// grows, the framing is lost or a write fails.
	pingsOut uint64
	changed  chan struct{}
	// wfailed: a write to the connection failed. x/net's writer keeps the
	// error and writes nothing after it, so no later frame will be seen.
	wfailed bool
	// inTotal counts bytes received; inFirst keeps the first few, where
	// an HTTP/1.x status line would be (http1Answer). peerClosed: the read
	// side ended by the server's close or reset, not the engine's.
	inTotal     int64
	inFirst     []byte
	http1Answer bool
	peerClosed  bool
	peerGone    bool // a write failed because the peer closed or reset
}

type observedTLSConn struct {
	*ObservedConn
	tls *tls.Conn
}

// ConnectionState lets the HTTP/2 client see the TLS state through the
// wrapper (x/net/http2 looks for this method).
func (c *observedTLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

// Ref names the connection in evidence.
func (c *ObservedConn) Ref() string { return c.ref }

// isClosed reports that the connection's read side has ended. It takes
// no lock (see closed), so it never waits on a read or a write.
func (c *ObservedConn) isClosed() bool { return c.closed.Load() }

// Write observes the frames in b before handing them to the connection, so
// a request is marked sent before the server can possibly answer it (and
// also when the write then fails: bytes handed over may have left).
//
// It hands over every frame but those for a stream a GOAWAY already
// received on the connection refused (above its lowest last-stream id),
// except HEADERS and CONTINUATION, which the server must still decode to
// keep its HPACK table in step. RFC 9113 section 6.8 lets the client treat
// such a stream as never created, and a server may treat a frame for it
// as one on an idle stream: Go's before Go 1.20 answers the RST_STREAM
// x/net sends when it aborts the stream by closing the connection, with
// the answers at or below the boundary in flight. Dropped DATA leaves the
// client's connection window short of what it spent, which only a
// draining connection sees. The GOAWAY is recorded on the read side before
// the client processes it, so anything the client writes in reaction is
// caught; so is a frame whose header is completed by a later Write, since
// a partial header is held back until its stream id is known. b is always
// accepted whole.
func (c *ObservedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if !c.lost {
		if err := c.out.feed(b, c.outKeep, c.outFrame); err != nil {
			c.loseLocked()
		}
	}
	out, dropped := c.gate.pass(b, c.refusedLocked)
	c.mu.Unlock()
	if dropped > 0 && c.hooks.Dropped != nil {
		c.hooks.Dropped(dropped)
	}
	if len(out) == 0 {
		return len(b), nil
	}
	n, err := c.Conn.Write(out)
	if err == nil {
		return len(b), nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.wfailed {
		c.wfailed = true
		c.changedLocked()
	}
	// A write the peer refused (a reset, a broken pipe), not one
	// after the engine's own close.
	c.peerGone = c.peerGone || !errors.Is(err, net.ErrClosed)
	return c.gate.accepted(n), err
}

// refusedLocked reports that a GOAWAY received on the connection refused
// the stream of an outgoing frame, and the frame is one the server can do
// without (Write). c.mu must be held.
func (c *ObservedConn) refusedLocked(h frameHeader) bool {
	return c.goAway != nil && h.stream != 0 && h.stream > c.goAway.LastStreamID &&
		h.typ != frameHeaders && h.typ != frameContinuation
}

// changedLocked wakes writeMark's waiters. c.mu must be held.
func (c *ObservedConn) changedLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// writeMark returns how many outgoing PING frames have been seen and a
// channel closed at the next change pingedSince reports.
func (c *ObservedConn) writeMark() (uint64, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pingsOut, c.changed
}

// pingedSince reports whether an outgoing PING was seen after mark. When
// not, final reports that none ever will be (framing lost, or a write
// failed), and changed is closed at the next change.
func (c *ObservedConn) pingedSince(mark uint64) (pinged, final bool, changed <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pingsOut > mark, c.lost || c.wfailed, c.changed
}

// Read observes the frames in what was read before the HTTP/2 client sees
// them, so evidence is recorded before the client reacts to it.
func (c *ObservedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 || err != nil {
		c.mu.Lock()
		if n > 0 && c.inTotal < int64(len(http1StatusPrefix)) {
			c.inFirst = append(c.inFirst, b[:min(n, len(http1StatusPrefix)-len(c.inFirst))]...)
			if string(c.inFirst) == http1StatusPrefix {
				// An HTTP/2 server's first bytes are a SETTINGS frame,
				// which can never begin "HTTP/1.".
				c.http1Answer = true
			}
		}
		c.inTotal += int64(n)
		if n > 0 && !c.lost && !c.http1Answer {
			if ferr := c.in.feed(b[:n], c.inKeep, c.inFrame); ferr != nil {
				c.loseLocked()
			}
		}
		closedNow := err != nil && !c.closed.Load()
		if closedNow {
			c.closed.Store(true)
			c.peerClosed = !errors.Is(err, net.ErrClosed)
		}
		c.mu.Unlock()
		if closedNow && c.hooks.Closed != nil {
			c.hooks.Closed()
		}
	}
	return n, err
}

func (c *ObservedConn) loseLocked() {
	if c.lost {
		return
	}
	c.lost = true
	c.inBlock, c.block = false, nil
	c.changedLocked()
	if c.hooks.Lost != nil {
		c.hooks.Lost()
	}
}

// outKeep says how much of an outgoing frame's payload to keep.
func (c *ObservedConn) outKeep(h frameHeader) (uint32, error) {
	switch h.typ {
	case frameHeaders, frameContinuation:
		cur := 0
		if c.inBlock && h.typ == frameContinuation {
			cur = len(c.block)
		}
		if uint32(cur)+h.length > maxHeaderBlock {
			return 0, fmt.Errorf("%w: header block above %d bytes", errObserverLost, maxHeaderBlock)
		}
		return h.length, nil
	}
	return 0, nil
}

func (c *ObservedConn) outFrame(h frameHeader, p []byte) error {
	switch h.typ {
	case frameHeaders:
		if c.inBlock {
			return fmt.Errorf("%w: HEADERS inside a header block", errObserverLost)
		}
		frag, err := headersFragment(h, p)
		if err != nil {
			return err
		}
		c.inBlock, c.block, c.blockOn = true, append(c.block[:0], frag...), h.stream
		c.addReqBytes(h.stream, int64(h.length))
	case frameContinuation:
		if !c.inBlock || h.stream != c.blockOn {
			return fmt.Errorf("%w: stray CONTINUATION", errObserverLost)
		}
		c.block = append(c.block, p...)
		c.addReqBytes(h.stream, int64(h.length))
	case frameData:
		c.addReqBytes(h.stream, int64(h.length))
		return nil
	case framePing:
		c.pingsOut++
		c.changedLocked()
		return nil
	default:
		return nil
	}
	if h.flags&flagEndHeaders == 0 {
		return nil
	}
	block, stream := c.block, c.blockOn
	c.inBlock = false
	// Only the attempt header's value is kept; every other value
	// (authorization included) is never even made a string.
	found, err := c.dec.decode(block)
	if cap(c.block) > 1<<16 {
		// Keep a small buffer for the next block, not a rare huge one.
		c.block = nil
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errObserverLost, err)
	}
	if found != "" {
		c.bind(found, stream, int64(len(block)))
	}
	return nil
}

// bind attaches a stream to its attempt; a second stream for the same
// attempt is a replay by a lower layer.
func (c *ObservedConn) bind(attemptID string, stream uint32, headerBytes int64) {
	if t := c.obs.lookup(attemptID); t != nil {
		c.attach(t, stream, headerBytes)
	}
}

// attach binds stream to t. t may have been untracked since it was looked
// up; c.mu must be held.
func (c *ObservedConn) attach(t *tracker, stream uint32, headerBytes int64) {
	t.mu.Lock()
	if t.gone {
		// Untracked since the lookup: its entries are being removed and
		// must not be re-created.
		t.mu.Unlock()
		return
	}
	c.streams[stream] = t
	if t.bindings == nil {
		t.bindings = t.bindBuf[:0]
	}
	t.bindings = append(t.bindings, binding{conn: c, stream: stream})
	t.conn, t.streamID = c, stream
	t.streams++
	t.afterGoAway = t.afterGoAway || c.goAway != nil
	t.reqBytes += headerBytes
	t.mu.Unlock()
}

func (c *ObservedConn) addReqBytes(stream uint32, n int64) {
	if t := c.streams[stream]; t != nil {
		t.mu.Lock()
		t.reqBytes += n
		t.mu.Unlock()
	}
}

// inKeep says how much of an incoming frame's payload to keep: only the
// fixed fields of RST_STREAM and GOAWAY. GOAWAY debug data is skipped
// unread.
func (c *ObservedConn) inKeep(h frameHeader) (uint32, error) {
	switch h.typ {
	case frameRSTStream:
		return 4, nil
	case frameGoAway:
		return 8, nil
	}
	return 0, nil
}

func (c *ObservedConn) inFrame(h frameHeader, p []byte) error {
	switch h.typ {
	case frameHeaders:
		if t := c.streams[h.stream]; t != nil {
			t.mu.Lock()
			t.respHeaders = true
			t.mu.Unlock()
		}
	case frameRSTStream:
		if len(p) < 4 {
			return fmt.Errorf("%w: short RST_STREAM", errObserverLost)
		}
		if t := c.streams[h.stream]; t != nil {
			code := evidence.ErrCode(binary.BigEndian.Uint32(p))
			t.mu.Lock()
			t.rst = &code
			t.mu.Unlock()
		}
	case frameGoAway:
		if len(p) < 8 {
			return fmt.Errorf("%w: short GOAWAY", errObserverLost)
		}
		g := evidence.GoAway{
			LastStreamID: binary.BigEndian.Uint32(p) & 0x7fffffff,
			Code:         evidence.ErrCode(binary.BigEndian.Uint32(p[4:])),
			DebugLen:     int(h.length) - 8,
		}
		c.mergeGoAway(g)
		if c.hooks.GoAway != nil {
			c.hooks.GoAway(g)
		}
	}
	return nil
}

// mergeGoAway folds one GOAWAY into what the connection's GOAWAYs said
// together (docs/contract.md section 3.3): the lowest last-stream id, because a
// stream above any one boundary was never processed, and the first
// non-NO_ERROR code, because a routine NO_ERROR on the way out does not
// take back an ENHANCE_YOUR_CALM or PROTOCOL_ERROR (x/net's ClientConn
// merges codes the same way). DebugLen belongs to the frame whose code is
// kept.
func (c *ObservedConn) mergeGoAway(g evidence.GoAway) {
	prev := c.goAway
	if prev == nil {
		c.goAway = &g
		return
	}
	merged := *prev
	merged.LastStreamID = min(prev.LastStreamID, g.LastStreamID)
	if prev.Code == evidence.CodeNoError {
		merged.Code, merged.DebugLen = g.Code, g.DebugLen
	}
	c.goAway = &merged
}

// headersFragment strips padding and priority from a HEADERS payload.
func headersFragment(h frameHeader, p []byte) ([]byte, error) {
	if h.flags&flagPadded != 0 {
		if len(p) < 1 {
			return nil, fmt.Errorf("%w: short padded HEADERS", errObserverLost)
		}
		pad := int(p[0])
		p = p[1:]
		if pad > len(p) {
			return nil, fmt.Errorf("%w: HEADERS padding exceeds payload", errObserverLost)
		}
		p = p[:len(p)-pad]
	}
	if h.flags&flagPriority != 0 {
		if len(p) < 5 {
			return nil, fmt.Errorf("%w: short HEADERS priority", errObserverLost)
		}
		p = p[5:]
	}
	return p, nil
}

type frameHeader struct {
	length uint32
	typ    uint8
	flags  uint8
	stream uint32
}

// parser splits a byte stream into HTTP/2 frames without copying payloads
// it does not need. It keeps state across calls, so frames may be split
// across reads and writes arbitrarily.
type parser struct {
	preface int // client preface bytes still to skip
	hdr     [9]byte
	hdrN    int
	inFrame bool
	fh      frameHeader
	remain  uint32
	keep    uint32
	payload []byte
}

func (p *parser) feed(b []byte, keep func(frameHeader) (uint32, error), frame func(frameHeader, []byte) error) error {
	for len(b) > 0 {
		if p.preface > 0 {
			off := len(clientPreface) - p.preface
			n := min(p.preface, len(b))
			if string(b[:n]) != clientPreface[off:off+n] {
				return fmt.Errorf("%w: bad client preface", errObserverLost)
			}
			p.preface -= n
			b = b[n:]
			continue
		}
		if !p.inFrame {
			n := copy(p.hdr[p.hdrN:], b)
			p.hdrN += n
			b = b[n:]
			if p.hdrN < len(p.hdr) {
				return nil
			}
			p.hdrN = 0
			p.fh = frameHeader{
				length: uint32(p.hdr[0])<<16 | uint32(p.hdr[1])<<8 | uint32(p.hdr[2]),
				typ:    p.hdr[3],
				flags:  p.hdr[4],
				stream: binary.BigEndian.Uint32(p.hdr[5:]) & 0x7fffffff,
			}
			k, err := keep(p.fh)
			if err != nil {
				return err
			}
			p.keep, p.remain, p.payload, p.inFrame = min(k, p.fh.length), p.fh.length, p.payload[:0], true
		}
		n := uint32(min(uint64(len(b)), uint64(p.remain)))
		if want := p.keep - uint32(len(p.payload)); want > 0 {
			p.payload = append(p.payload, b[:min(n, want)]...)
		}
		p.remain -= n
		b = b[n:]
		if p.remain == 0 {
			p.inFrame = false
			if err := frame(p.fh, p.payload); err != nil {
				return err
			}
		}
	}
	return nil
}

// outGate decides, frame by frame, which of the bytes written to an
// ObservedConn go on to the connection (ObservedConn.Write). It follows
// the framing by lengths alone, so it keeps its place whatever the
// observer's parser makes of the frames; a client preface that is not
// HTTP/2's turns it off. Bytes are never reordered.
type outGate struct {
	preface int // client preface bytes still to come
	off     bool
	hdr     [9]byte
	hdrN    int    // bytes of a frame header held back, in hdr
	remain  uint32 // payload bytes of the current frame still to come
	drop    bool   // the current frame is kept off the wire
	// buf holds the output when it is not a prefix of the input; segs maps
	// its pieces back to the input, for accepted.
	buf  []byte
	segs []gateSeg
	// inLen and outLen are the last pass's input and output lengths.
	inLen, outLen int
	direct        bool // the last output was a prefix of its input
}

// gateSeg says that input bytes [from, to) are output bytes from at.
type gateSeg struct{ from, to, at int }

// pass returns the bytes of b to write now, and how many frames it
// dropped. Held header bytes from an earlier call come first; a header
// that b leaves incomplete is held. The result aliases b when it can.
func (g *outGate) pass(b []byte, refused func(frameHeader) bool) (out []byte, dropped int) {
	g.inLen = len(b)
	if g.off {
		g.direct, g.outLen = true, len(b)
		return b, 0
	}
	g.buf, g.segs = g.buf[:0], g.segs[:0]
	copied := false // the output is g.buf; otherwise it is b[:end]
	end := 0
	toBuf := func() {
		if !copied {
			g.buf = append(g.buf, b[:end]...)
			g.segs = append(g.segs, gateSeg{0, end, 0})
			copied = true
		}
	}
	keep := func(from, to int) {
		if !copied && from == end {
			end = to
			return
		}
		toBuf()
		g.segs = append(g.segs, gateSeg{from, to, len(g.buf)})
		g.buf = append(g.buf, b[from:to]...)
	}
	for i := 0; i < len(b); {
		switch {
		case g.preface > 0:
			off := len(clientPreface) - g.preface
			n := min(g.preface, len(b)-i)
			if string(b[i:i+n]) != clientPreface[off:off+n] {
				// Not HTTP/2: nothing to follow, everything passes.
				g.off = true
				keep(i, len(b))
				i = len(b)
				continue
			}
			keep(i, i+n)
			g.preface -= n
			i += n
		case g.remain > 0:
			n := int(min(uint64(g.remain), uint64(len(b)-i)))
			if !g.drop {
				keep(i, i+n)
			}
			g.remain -= uint32(n)
			i += n
		default:
			n := copy(g.hdr[g.hdrN:], b[i:])
			if g.hdrN+n < len(g.hdr) {
				// Its stream id is not known yet: held for the next call.
				g.hdrN += n
				i += n
				continue
			}
			held := g.hdrN
			g.hdrN = 0
			h := frameHeader{
				length: uint32(g.hdr[0])<<16 | uint32(g.hdr[1])<<8 | uint32(g.hdr[2]),
				typ:    g.hdr[3],
				stream: binary.BigEndian.Uint32(g.hdr[5:]) & 0x7fffffff,
			}
			g.remain, g.drop = h.length, refused(h)
			switch {
			case g.drop:
				dropped++
			case held > 0:
				toBuf()
				g.buf = append(g.buf, g.hdr[:held]...)
				keep(i, i+n)
			default:
				keep(i, i+n)
			}
			i += n
		}
	}
	if !copied {
		g.direct, g.outLen = true, end
		return b[:end], dropped
	}
	g.direct, g.outLen = false, len(g.buf)
	out = g.buf
	if cap(g.buf) > 64<<10 {
		// Keep a small buffer for the next time, not a rare huge one.
		g.buf = nil
	}
	return out, dropped
}

// accepted says how many bytes of the last pass's input are accounted
// for when only n bytes of its output were written: those written, and
// those dropped or held before the first byte that was not.
func (g *outGate) accepted(n int) int {
	switch {
	case n >= g.outLen:
		return g.inLen
	case g.direct:
		return n
	}
	done := 0
	for _, s := range g.segs {
		if n < s.at+(s.to-s.from) {
			return max(done, s.from+max(n-s.at, 0))
		}
		done = s.to
	}
	return done
}
