package gateway

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/workflows"
)

// streamOptions say how one stream is served.
type streamOptions struct {
	// encoder renders the stream in its surface's shape.
	encoder answer.Encoder
	// resume: a reader resumes after the numbered event after
	// (starting_after); the numbered events up to it are skipped.
	resume bool
	after  uint64
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

// event writes one event.
func (s *sseWriter) event(e answer.Event) error {
	s.buf = s.buf[:0]
	if e.ID != "" {
		s.buf = append(append(append(s.buf, "id: "...), e.ID...), '\n')
	}
	if e.Name != "" {
		s.buf = append(append(append(s.buf, "event: "...), e.Name...), '\n')
	}
	s.buf = append(append(append(s.buf, "data: "...), e.Data...), "\n\n"...)
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
// it gets a real error status; after the 200, a failure is the encoder's
// in-band error and the stream ends.
func (g *Gateway) serveStream(w http.ResponseWriter, r *http.Request, s *session, so streamOptions) {
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	st := &streamRun{g: g, s: s, so: so, enc: so.encoder,
		sw: &sseWriter{w: w, rc: http.NewResponseController(w)}, keepAlive: time.NewTicker(g.o.KeepAlive)}
	if !s.replayed {
		// An action that ended is streamed from its result alone: the
		// same deltas, and its state known before the status.
		st.events = g.follow(ctx, s.who.ID, 0)
	}
	defer st.keepAlive.Stop()
	wt := g.newWaiter(s)
	defer wt.cancel()
	done, ok := st.untilResult(ctx, wt)
	if !ok {
		if st.broken {
			// A write that failed is the caller gone, whether or not the
			// request's context has seen it yet.
			g.disconnected(s)
		}
		return
	}
	if done.err != nil {
		st.fail(g.waitError(s, done.err), "")
		return
	}
	res := done.res
	o := outcomeOf(res)
	if o.Problem != nil && !st.sw.started && (res.Response == nil || len(answerDeltas(res.Response)) == 0) {
		// Nothing was streamed, and nothing will be: a real status.
		st.fail(o.Problem, string(res.State))
		return
	}
	if !st.sw.started && !st.begin(res.State) {
		return
	}
	// The events published before the result: all in this process's hub
	// already, which the end closes.
	g.endLocal(s.who.ID, res.State)
	bound := drainBound
	if !st.fed.any() {
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
	enc       answer.Encoder
	sw        *sseWriter
	events    <-chan activities.StreamEvent
	keepAlive *time.Ticker
	// broken: a write to the caller failed.
	broken bool
	// fed is what the encoder was fed, to complete the stream from the
	// result.
	fed fedDeltas
}

// deltaOf is the delta a hub event carries, if it carries content.
func deltaOf(ev activities.StreamEvent) (answer.Delta, bool) {
	switch ev.Kind {
	case activities.EventContent:
		return answer.Delta{Kind: answer.Text, Text: ev.Delta}, true
	case activities.EventRefusal:
		return answer.Delta{Kind: answer.Refusal, Text: ev.Refusal}, true
	case activities.EventToolCall:
		t := ev.ToolCall
		return answer.Delta{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: t.Index, ID: t.ID, Type: t.Type, Name: t.Name, Arguments: t.Arguments}}, true
	}
	return answer.Delta{}, false
}

// emit writes the encoder's events, skipping the numbered ones a resumed
// reader already has; false means the client left.
func (st *streamRun) emit(evs []answer.Event) bool {
	for _, e := range evs {
		if st.so.resume && e.Numbered && e.Seq <= st.so.after {
			continue
		}
		if st.sw.event(e) != nil {
			st.broken = true
			return false
		}
		st.keepAlive.Reset(st.g.o.KeepAlive)
	}
	return true
}

// delta feeds one delta to the encoder and writes what it makes; false
// means the client left.
func (st *streamRun) delta(d answer.Delta) bool {
	st.fed.add(d)
	return st.emit(st.enc.Delta(d))
}

// write relays a hub event, if it carries content; false means the client
// left.
func (st *streamRun) write(ev activities.StreamEvent) bool {
	if d, ok := deltaOf(ev); ok {
		return st.delta(d)
	}
	return true
}

// begin sends the status and headers (x-durallm-state: the action's
// state), then what opens the stream.
func (st *streamRun) begin(state workflows.State) bool {
	if st.sw.begin(string(state)) != nil {
		st.broken = true
		return false
	}
	return st.emit(st.enc.Start())
}

// untilResult relays events as they come until the action's result: the
// status is held until the first content (or StreamHold), keep-alives go
// out while the stream is quiet, and an action that comes to await a
// verdict before the commit ends the stream with that problem. ok is
// false when the stream has ended already.
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
				// An attempt is producing this content.
				if !st.begin(workflows.StateDispatching) {
					return done, false
				}
			}
			if !st.write(ev) {
				return done, false
			}
		case d := <-wt.result:
			return d, true
		case <-hold.C:
			if !st.sw.started && !st.begin(g.stateNow(ctx, st.s.who.ID)) {
				return done, false
			}
		case <-st.keepAlive.C:
			if st.sw.started && st.sw.keepAlive() != nil {
				st.broken = true
				return done, false
			}
		case <-poll.C:
			if st.fed.any() {
				// Committed: the action cannot come to await a verdict.
				continue
			}
			if state, awaiting := wt.poll(ctx); awaiting {
				st.fail(awaitingProblem(st.s.who.ID, state.AwaitingAttempt), string(state.State))
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

// finish writes what the result has that the deltas did not carry, then
// the stream's end: the encoder's End, or its in-band error for an
// outcome that is no answer.
func (st *streamRun) finish(res workflows.ActionResult, o outcome) {
	a := answerOf(st.s.who, res, o)
	// A canceled action keeps the text delivered before the cancel: it is
	// streamed before the problem, as it was live.
	for _, d := range st.fed.rest(a.Response) {
		if !st.delta(d) {
			return
		}
	}
	if o.Problem != nil {
		st.fail(o.Problem, string(res.State))
		return
	}
	st.emit(st.enc.End(a))
}

// fail ends a stream with p: as the answer's status before the 200, as
// the encoder's in-band error after it.
func (st *streamRun) fail(p *answer.Problem, state string) {
	if !st.sw.started {
		if state != "" {
			st.sw.w.Header().Set("X-Durallm-State", state)
		}
		writeProblem(st.sw.w, st.s.surface, p)
		return
	}
	st.emit(st.enc.Fail(*p))
}
