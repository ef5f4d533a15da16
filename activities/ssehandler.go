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
// stream of that action's events, for a caller in another process than the
// worker (the in-process ways are Follow and Subscribe). The action ref is
// one path segment, path-escaped by the caller (url.PathEscape), so a ref
// containing "/" travels as "%2F"; an empty ref or a literal extra slash is
// 404, a method other than GET is 405, a missing or wrong bearer token
// (when AuthToken is set) is 401, a starting_after that is not a number is
// 400, and a ResponseWriter that cannot flush is 500.
//
// With ?starting_after=N (N ≥ 0) it serves the action's replay log after
// sequence number N, then live, each event with its own sequence number as
// its id and its kind as its name, ending after the end event:
//
//	id: 1
//	event: content
//	data: {"seq":1,"kind":"content","attempt":1,"delta":"Hel"}
//
//	id: 7
//	event: end
//	data: {"seq":7,"kind":"end","attempt":0,"end":"completed"}
//
// Nothing is dropped and nothing is missed: the log is kept for Retention
// (10 minutes) after the end, so a caller may open the stream before the
// action starts, after it ended, or again after a cut (resuming after the
// last id it read). This is how a gateway in another process reads an
// attempt's stream (docs/gateway.md).
//
// Without starting_after it serves the per-connection format, from the
// moment the request arrives, each event with a per-connection sequence
// number as its id:
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
// an "end" event ({"end":"completed"}) when the action's stream ends, and
// ": keep-alive" comment lines during silence. Only content deltas are
// sent (refusals, tool calls, finish and usage are in the typed format). A
// delta's attempt says which attempt produced it. A connection that starts
// mid-answer sees the rest of it, and a reconnecting client's
// Last-Event-ID is ignored. stream_incomplete and end are final: the
// stream ends there (docs/contract.md section 6.4). A client that falls
// more than Buffer events behind loses deltas rather than stalling the
// attempt; when the stream ends with the client still connected
// (stream_incomplete, end, MaxDuration), what the subscription still holds
// is sent, then a "dropped" event with the count if any were lost.
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

	var after uint64
	typed := r.URL.Query().Has("starting_after")
	if typed {
		n, err := strconv.ParseUint(r.URL.Query().Get("starting_after"), 10, 64)
		if err != nil {
			http.Error(w, "starting_after: want a sequence number (0 or more)", http.StatusBadRequest)
			return
		}
		after = n
	}
	var events <-chan StreamEvent
	var stop func() int
	var cursor *Cursor
	if typed {
		cursor = h.sinks.Follow(ref, after)
		defer cursor.Close()
	} else {
		events, stop = h.sinks.Subscribe(ref, h.buffer)
		defer stop()
	}
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
	if typed {
		h.serveLog(r.Context(), st, cursor)
		return
	}
	h.serve(r.Context(), st, events, stop)
}

// serveLog forwards an action's events from its replay log, each with its
// sequence number as its id, until the end event, the client goes away,
// MaxDuration passes or a write fails. Nothing is dropped: a slow client
// reads the log at its own pace.
func (h *streamHandler) serveLog(ctx context.Context, st *sseStream, c *Cursor) {
	expired, stopClock := h.after(h.maxDuration)
	defer stopClock()
	keepAlive := time.NewTicker(h.keepAlive)
	defer keepAlive.Stop()
	for {
		ev, ok, wait, err := c.Poll()
		if err != nil {
			return
		}
		if ok {
			if st.logEvent(ev) != nil || ev.Kind == EventEnd {
				return
			}
			keepAlive.Reset(h.keepAlive)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-expired:
			return
		case <-keepAlive.C:
			if st.keepAlive() != nil {
				return
			}
		case <-wait:
		}
	}
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
			if ev.Kind == EventIncomplete || ev.Kind == EventEnd {
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
	sseEnd struct {
		End string `json:"end"`
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

// event writes one event in the per-connection format: content as delta,
// stream_incomplete and end; the other kinds are only in the typed format.
func (st *sseStream) event(ev StreamEvent) error {
	switch ev.Kind {
	case EventIncomplete:
		return st.send("stream_incomplete", sseIncomplete{Attempt: ev.Attempt, Reason: ev.Incomplete})
	case EventEnd:
		return st.send("end", sseEnd{End: ev.End})
	case EventContent:
		return st.send("delta", sseDelta{Attempt: ev.Attempt, Delta: ev.Delta})
	}
	return nil
}

// logEvent writes one event in the typed format: the event's own
// sequence number as the id, its kind as the name, the event as the data.
func (st *sseStream) logEvent(ev StreamEvent) error {
	ev.ActionRef = ""
	st.seq = ev.Seq - 1
	return st.send(string(ev.Kind), ev)
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
