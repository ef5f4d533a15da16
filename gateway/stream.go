package gateway

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// streamOptions say how one stream is served.
type streamOptions struct {
	// includeUsage sends the usage chunk before [DONE].
	includeUsage bool
	// after skips the events up to this sequence number (a resumed
	// stream: starting_after).
	after uint64
}

// drainBound is how long a stream, once its action's result is known,
// still reads the events that were published before it: in this process
// they are all in the hub already, and the end event follows at once.
const drainBound = 5 * time.Second

// drainNothing bounds that wait when nothing has streamed yet.
const drainNothing = 500 * time.Millisecond

// sseWriter writes one stream's events.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	lastID  uint64
	buf     []byte
}

// begin sends the 200 and the stream's headers.
func (s *sseWriter) begin(state string) error {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	if state != "" {
		h.Set("X-Durallm-State", state)
	}
	s.w.WriteHeader(http.StatusOK)
	s.started = true
	return s.rc.Flush()
}

// data writes one event whose id is seq.
func (s *sseWriter) data(seq uint64, payload []byte) error {
	s.lastID = seq
	s.buf = append(s.buf[:0], "id: "...)
	s.buf = strconv.AppendUint(s.buf, seq, 10)
	s.buf = append(s.buf, "\ndata: "...)
	s.buf = append(s.buf, payload...)
	s.buf = append(s.buf, "\n\n"...)
	return s.flush()
}

// raw writes an event without an id ([DONE], the in-band error).
func (s *sseWriter) raw(payload []byte) error {
	s.buf = append(append(append(s.buf[:0], "data: "...), payload...), "\n\n"...)
	return s.flush()
}

func (s *sseWriter) keepAlive() error {
	s.buf = append(s.buf[:0], ": keep-alive\n\n"...)
	return s.flush()
}

func (s *sseWriter) flush() error {
	if _, err := s.w.Write(s.buf); err != nil {
		return err
	}
	return s.rc.Flush()
}

// follow returns the action's events after sequence number after, from
// this process's hub and, with Remote, from the worker running the
// attempt elsewhere (whichever streams content first); the channel closes
// once every source ended, or when ctx ends. Nil without either: nothing
// streams, and the answer comes whole from the result.
func (g *Gateway) follow(ctx context.Context, id string, after uint64) <-chan activities.StreamEvent {
	if g.o.Streams == nil && g.o.Remote == nil {
		return nil
	}
	out := make(chan activities.StreamEvent, 64)
	m := &merger{out: out}
	var wg sync.WaitGroup
	if g.o.Streams != nil {
		c := g.o.Streams.Follow(id, after)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			for {
				ev, err := c.Next(ctx)
				if err != nil || !m.emit(ctx, fromLocal, ev) || ev.Kind == activities.EventEnd {
					return
				}
			}
		}()
	}
	if g.o.Remote != nil {
		delay := time.Duration(0)
		if g.o.Streams != nil {
			delay = remoteDelay
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.followRemote(ctx, id, after, m, delay)
		}()
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out
}

// endLocal ends the action's stream in this process's hub once its result
// is known, so every follower here stops after the last event.
func (g *Gateway) endLocal(id string, state workflows.State) {
	if g.o.Streams != nil {
		g.o.Streams.End(id, string(state))
	}
}

// content reports whether ev is past the commit boundary: text, a
// refusal or a tool call.
func content(ev activities.StreamEvent) bool {
	switch ev.Kind {
	case activities.EventContent, activities.EventRefusal, activities.EventToolCall:
		return true
	}
	return false
}

// serveStream answers a streamed request. It holds its status until the
// first content (at most StreamHold), so that an action that fails before
// it gets a real error status; after the 200, a failure is one in-band
// error event and the stream closes without [DONE].
func (g *Gateway) serveStream(w http.ResponseWriter, r *http.Request, s *session, so streamOptions) {
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	st := &streamRun{g: g, s: s, so: so,
		sw: &sseWriter{w: w, rc: http.NewResponseController(w)}, ch: &chunker{who: s.who, includeUsage: so.includeUsage},
		events: g.follow(ctx, s.who.ID, so.after), keepAlive: time.NewTicker(g.o.KeepAlive)}
	defer st.keepAlive.Stop()
	wt := g.newWaiter(s)
	defer wt.cancel()
	done, ok := st.untilResult(ctx, wt)
	if !ok {
		return
	}
	if done.err != nil {
		g.fail(st.sw, g.waitError(s, done.err), "")
		return
	}
	res := done.res
	o := outcomeOf(res)
	if o.Err != nil && !st.sw.started {
		w.Header().Set("X-Durallm-State", string(res.State))
		writeError(w, o.Err)
		return
	}
	if !st.sw.started && !st.begin() {
		return
	}
	// The events published before the result: all in this process's hub
	// already, which the end closes.
	g.endLocal(s.who.ID, res.State)
	bound := drainBound
	if !st.ch.streamed() {
		// Nothing came before the result: a worker elsewhere that cannot
		// be read, or no stream at all. The result has the answer.
		bound = drainNothing
	}
	if !st.drain(ctx, bound) {
		return
	}
	st.finish(res, o)
}

// streamRun is one streamed answer as serveStream writes it.
type streamRun struct {
	g         *Gateway
	s         *session
	so        streamOptions
	sw        *sseWriter
	ch        *chunker
	events    <-chan activities.StreamEvent
	keepAlive *time.Ticker
}

// write sends ev's chunk, if it makes one; false means the client left.
func (st *streamRun) write(ev activities.StreamEvent) bool {
	if ev.Kind == activities.EventEnd || ev.Kind == activities.EventIncomplete {
		return true
	}
	if b, ok := st.ch.chunk(ev); ok {
		st.keepAlive.Reset(st.g.o.KeepAlive)
		return st.sw.data(ev.Seq, b) == nil
	}
	return true
}

// begin sends the status and headers.
func (st *streamRun) begin() bool {
	state := "running"
	if st.s.replayed {
		state = ""
	}
	return st.sw.begin(state) == nil
}

// untilResult relays events as they come until the action's result: the
// status is held until the first content (or StreamHold), keep-alives go
// out while the stream is quiet, and an action that comes to await a
// verdict before the commit ends the stream with that error. ok is false
// when the stream has ended already.
func (st *streamRun) untilResult(ctx context.Context, wt *waiter) (done waitDone, ok bool) {
	g := st.g
	hold := time.NewTimer(g.o.StreamHold)
	defer hold.Stop()
	poll := time.NewTimer(g.o.StatePoll)
	defer poll.Stop()
	for {
		select {
		case ev, open := <-st.events:
			if !open {
				st.events = nil
				continue
			}
			if !st.sw.started {
				if !content(ev) {
					continue
				}
				if !st.begin() {
					return done, false
				}
			}
			if !st.write(ev) {
				return done, false
			}
		case d := <-wt.result:
			return d, true
		case <-hold.C:
			if !st.sw.started && !st.begin() {
				return done, false
			}
		case <-st.keepAlive.C:
			if st.sw.started && st.sw.keepAlive() != nil {
				return done, false
			}
		case <-poll.C:
			if st.ch.streamed() {
				// Committed: the action cannot come to await a verdict.
				continue
			}
			if state, awaiting := wt.poll(ctx); awaiting {
				g.fail(st.sw, awaitingError(st.s.who.ID, state.AwaitingAttempt), string(state.State))
				return done, false
			}
			poll.Reset(wt.nextPoll())
		case <-ctx.Done():
			g.disconnected(st.s)
			return done, false
		}
	}
}

// drain relays the events still on their way after the result, for at
// most bound; false means the client left.
func (st *streamRun) drain(ctx context.Context, bound time.Duration) bool {
	t := time.NewTimer(bound)
	defer t.Stop()
	for st.events != nil {
		select {
		case ev, open := <-st.events:
			if !open {
				st.events = nil
				continue
			}
			if !st.write(ev) {
				return false
			}
		case <-t.C:
			st.events = nil
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// finish writes what the result has that the events did not, then the
// stream's end: [DONE], or the in-band error of a row that is no success.
func (st *streamRun) finish(res workflows.ActionResult, o outcome) {
	if o.Err != nil {
		st.g.fail(st.sw, o.Err, string(res.State))
		return
	}
	resp := res.Response
	if resp == nil {
		resp = emptyResponse()
	}
	seq := st.sw.lastID
	for _, b := range st.ch.rest(resp) {
		seq++
		if seq <= st.so.after {
			continue
		}
		if st.sw.data(seq, b) != nil {
			return
		}
	}
	if o.Incomplete != "" {
		_ = st.sw.raw(errorBody(&apiError{Type: typeStreamIncomplete, Code: o.Incomplete,
			Message: "the answer was cut after it started (" + o.Incomplete + "): what arrived is all there is, and no second answer follows"}))
		return
	}
	_ = st.sw.raw([]byte("[DONE]"))
}

// fail ends a stream with e: as the answer's status before the 200, as
// one in-band error event after it (then the stream closes without
// [DONE], which every OpenAI SDK raises on).
func (g *Gateway) fail(sw *sseWriter, e *apiError, state string) {
	if !sw.started {
		if state != "" {
			sw.w.Header().Set("X-Durallm-State", state)
		}
		writeError(sw.w, e)
		return
	}
	_ = sw.raw(errorBody(e))
}

// emptyResponse stands in for an ended action's missing response.
func emptyResponse() *providers.Response { return &providers.Response{} }
