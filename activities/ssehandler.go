package activities

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// StreamHandlerOptions configures Streams.StreamHandler. The zero value is
// usable: no authentication, the defaults below.
type StreamHandlerOptions struct {
	// Prefix is the path the action ref follows. Empty means
	// "/v1/streams/"; a missing leading or trailing slash is added.
	Prefix string
	// AuthToken, when set, is required as "Authorization: Bearer <token>";
	// any other request gets 401. The stream carries generated text, so
	// leave it empty only behind something else that authenticates.
	AuthToken string
	// KeepAlive is how long the stream may stay silent before a
	// ": keep-alive" comment is sent, so that proxies and load balancers
	// with idle timeouts keep the connection open. Zero means 15s.
	KeepAlive time.Duration
	// Buffer is the subscription's capacity (see Streams.Subscribe). A client
	// that falls further behind loses deltas, reported in a final
	// "dropped" event. Zero means 256.
	Buffer int
	// MaxDuration bounds one stream, so that a client that never hangs up
	// (or stops reading without hanging up) cannot hold a subscription
	// forever. Zero means 30m.
	MaxDuration time.Duration
}

const (
	defaultStreamPrefix      = "/v1/streams/"
	defaultStreamKeepAlive   = 15 * time.Second
	defaultStreamBuffer      = 256
	defaultStreamMaxDuration = 30 * time.Minute
	// finalWriteGrace is how long past MaxDuration the last writes (what
	// the subscription still held, and the dropped count) may take. The
	// write deadline is what unblocks a handler stuck writing to a client
	// that stopped reading; the grace keeps a client that is merely slow
	// from losing the tail of its stream.
	finalWriteGrace = 5 * time.Second
)

// StreamHandler serves GET {Prefix}{actionRef} as a server-sent-event
// stream of that action's deltas, for a caller in another process than the
// worker (the in-process way is Subscribe). The action ref is one path
// segment, path-escaped by the caller (url.PathEscape), so a ref containing
// "/" travels as "%2F"; an empty ref or a literal extra slash is 404, a
// method other than GET is 405, a missing or wrong bearer token (when
// AuthToken is set) is 401, and a ResponseWriter that cannot flush is 500.
//
// The events, each with a per-connection sequence number as its id:
//
//	id: 1
//	event: delta
//	data: {"attempt":1,"delta":"Hel"}
//
//	id: 2
//	event: stream_incomplete
//	data: {"attempt":1,"reason":"idle_timeout"}
//
//	id: 3
//	event: dropped
//	data: {"dropped":4}
//
// and ": keep-alive" comment lines during silence. A delta's attempt says
// which attempt produced it: deltas of a failed attempt may be followed by
// those of a later one (docs/providers.md, "The commit boundary").
//
// What a stream does and does not deliver:
//
//   - Only deltas published after the request arrives. Nothing is
//     replayed: a connection that starts mid-answer sees the rest of it,
//     and the ids are this connection's own, so a reconnecting client's
//     Last-Event-ID is ignored. The action's final result always carries
//     the whole text. A caller that needs every delta opens the stream
//     before it starts the action, which it can because it chooses the
//     action id: once the response headers have arrived the subscription is
//     in place.
//   - stream_incomplete is final: the contract (docs/contract.md section 6.4)
//     allows one per action, after its last delta, and no second answer
//     after it, so the stream ends there.
//   - Nothing marks the normal end of an action: Streams carries deltas,
//     not outcomes. A caller stops reading when its action's result
//     arrives (Action.Result on the client), or when MaxDuration ends the
//     stream. Every delta is published before the attempt returns, so the
//     result never precedes text it lacks.
//   - A client that falls more than Buffer events behind loses deltas
//     rather than stalling the attempt. When the stream ends with the
//     client still connected (stream_incomplete, MaxDuration), what the
//     subscription still holds is sent, then a "dropped" event with the
//     count if any were lost. A client that hangs up is simply
//     unsubscribed.
//
// An explicit end event (an End(actionRef) that closes every subscription
// of the action) is a follow-up: it needs a closed flag on the subscriber
// in sink.go, because closing a subscription's channel from outside would
// race with its stop function's close, and a call from the workflow's last
// step, because an attempt does not know whether a later one follows.
//
// The handler logs nothing, so generated text reaches only the client. It
// sets the connection's write deadline to MaxDuration plus a short grace,
// overriding a shorter server WriteTimeout, which would otherwise cut
// every long stream.
func (s *Streams) StreamHandler(opts StreamHandlerOptions) http.Handler {
	return s.streamHandler(opts)
}

func (s *Streams) streamHandler(opts StreamHandlerOptions) *streamHandler {
	h := &streamHandler{
		sinks:       s,
		prefix:      opts.Prefix,
		keepAlive:   opts.KeepAlive,
		buffer:      opts.Buffer,
		maxDuration: opts.MaxDuration,
		after: func(d time.Duration) (<-chan time.Time, func() bool) {
			t := time.NewTimer(d)
			return t.C, t.Stop
		},
	}
	if h.prefix == "" {
		h.prefix = defaultStreamPrefix
	}
	if !strings.HasPrefix(h.prefix, "/") {
		h.prefix = "/" + h.prefix
	}
	if !strings.HasSuffix(h.prefix, "/") {
		h.prefix += "/"
	}
	if h.keepAlive <= 0 {
		h.keepAlive = defaultStreamKeepAlive
	}
	if h.buffer < 1 {
		h.buffer = defaultStreamBuffer
	}
	if h.maxDuration <= 0 {
		h.maxDuration = defaultStreamMaxDuration
	}
	if opts.AuthToken != "" {
		// Comparing digests keeps the comparison constant-time in the
		// token's length too.
		h.auth = true
		h.token = sha256.Sum256([]byte(opts.AuthToken))
	}
	return h
}

type streamHandler struct {
	sinks       *Streams
	prefix      string
	auth        bool
	token       [sha256.Size]byte
	keepAlive   time.Duration
	buffer      int
	maxDuration time.Duration
	// after starts one stream's MaxDuration clock. It is a field so that
	// tests can end a stream on cue rather than on a wall clock.
	after func(time.Duration) (<-chan time.Time, func() bool)
}

func (h *streamHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Authentication comes first, so a caller without the token learns
	// nothing about the endpoint, not even which paths it serves.
	if h.auth && !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="durallm streams"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	ref, ok := h.actionRef(r)
	if !ok {
		http.NotFound(w, r)
		return
	}
	// Checked before subscribing and before the 200: a stream that cannot
	// be flushed would hold every delta until the handler returns.
	if !canFlush(w) {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}

	events, stop := h.sinks.Subscribe(ref, h.buffer)
	defer stop()
	st := &sseStream{w: w, rc: http.NewResponseController(w)}
	// Not every ResponseWriter supports deadlines (ErrNotSupported); such
	// a stream is then bounded by MaxDuration between writes only.
	_ = st.rc.SetWriteDeadline(time.Now().Add(h.maxDuration + finalWriteGrace))

	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-store")
	// Buffering proxies (nginx) would otherwise hold deltas back.
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The headers go out now, after Subscribe: their arrival tells the
	// caller that it may start the action without missing a delta.
	if err := st.rc.Flush(); err != nil {
		return
	}
	h.serve(r.Context(), st, events, stop)
}

// authorized reports whether r carries the bearer token. The scheme is
// case-insensitive (RFC 7235); the token is not.
func (h *streamHandler) authorized(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(got[:], h.token[:]) == 1
}

// actionRef extracts the one path segment after the prefix, from the
// escaped path so that an escaped "/" inside a ref is told apart from a
// separator.
func (h *streamHandler) actionRef(r *http.Request) (string, bool) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), h.prefix)
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return "", false
	}
	ref, err := url.PathUnescape(rest)
	if err != nil || ref == "" {
		return "", false
	}
	return ref, true
}

// canFlush reports whether http.ResponseController can flush w: w or a
// writer it unwraps to flushes. It is the same walk the controller does,
// made before anything is written so that the answer can still be a 500.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case http.Flusher, interface{ FlushError() error }:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// serve forwards events until the client goes away, MaxDuration passes, a
// write fails or the action's stream_incomplete has been sent.
func (h *streamHandler) serve(ctx context.Context, st *sseStream, events <-chan StreamEvent, stop func() int) {
	expired, stopClock := h.after(h.maxDuration)
	defer stopClock()
	keepAlive := time.NewTicker(h.keepAlive)
	defer keepAlive.Stop()
	for {
		select {
		case <-ctx.Done():
			// The client is gone: there is nobody to tell about drops.
			// ServeHTTP's deferred stop unsubscribes.
			return
		case <-expired:
			h.finish(ctx, st, events, stop)
			return
		case <-keepAlive.C:
			if st.keepAlive() != nil {
				return
			}
		case ev, ok := <-events:
			if !ok {
				return
			}
			if st.event(ev) != nil {
				return
			}
			// Keep-alives are for silence only.
			keepAlive.Reset(h.keepAlive)
			if ev.Incomplete != "" {
				h.finish(ctx, st, events, stop)
				return
			}
		}
	}
}

// finish ends the subscription with the client still there: it sends what
// the subscription still holds (delivered to it, not dropped, so the
// client's deltas plus the dropped count account for every event published
// while it was subscribed), then the dropped count if any.
func (h *streamHandler) finish(ctx context.Context, st *sseStream, events <-chan StreamEvent, stop func() int) {
	dropped := stop()
	for ev := range events {
		if ctx.Err() != nil || st.event(ev) != nil {
			return
		}
	}
	if dropped > 0 && ctx.Err() == nil {
		_ = st.send("dropped", sseDropped{Dropped: dropped})
	}
}

// The data of each event. The field names are the wire format.
type (
	sseDelta struct {
		Attempt int    `json:"attempt"`
		Delta   string `json:"delta"`
	}
	sseIncomplete struct {
		Attempt int    `json:"attempt"`
		Reason  string `json:"reason"`
	}
	sseDropped struct {
		Dropped int `json:"dropped"`
	}
)

// sseStream writes one connection's events. Not safe for concurrent use:
// only the handler's goroutine writes.
type sseStream struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	seq uint64
	buf []byte
}

func (st *sseStream) event(ev StreamEvent) error {
	if ev.Incomplete != "" {
		return st.send("stream_incomplete", sseIncomplete{Attempt: ev.Attempt, Reason: ev.Incomplete})
	}
	return st.send("delta", sseDelta{Attempt: ev.Attempt, Delta: ev.Delta})
}

// send writes one event. The data is JSON, which never contains a raw line
// break, so any text fits on the one data line without escaping by hand.
func (st *sseStream) send(name string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", name, err)
	}
	st.seq++
	st.buf = append(st.buf[:0], "id: "...)
	st.buf = strconv.AppendUint(st.buf, st.seq, 10)
	st.buf = append(st.buf, "\nevent: "...)
	st.buf = append(st.buf, name...)
	st.buf = append(st.buf, "\ndata: "...)
	st.buf = append(st.buf, b...)
	st.buf = append(st.buf, "\n\n"...)
	return st.flush(name + " event")
}

func (st *sseStream) keepAlive() error {
	st.buf = append(st.buf[:0], ": keep-alive\n\n"...)
	return st.flush("keep-alive")
}

func (st *sseStream) flush(what string) error {
	if _, err := st.w.Write(st.buf); err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	if err := st.rc.Flush(); err != nil {
		return fmt.Errorf("flush %s: %w", what, err)
	}
	return nil
}
