package activities

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// EventKind says what a StreamEvent carries.
type EventKind string

// The kinds of event an action's stream holds, in the order a complete
// answer produces them: content, refusal and tool-call deltas in the order
// the provider sent them, then the finish reason and usage, then the end.
const (
	// EventContent carries a piece of generated text (Delta).
	EventContent EventKind = "content"
	// EventRefusal carries a piece of the model's refusal (Refusal).
	EventRefusal EventKind = "refusal"
	// EventToolCall carries a piece of a tool call (ToolCall).
	EventToolCall EventKind = "tool_call"
	// EventFinish carries the provider's finish reason (FinishReason).
	EventFinish EventKind = "finish"
	// EventUsage carries the usage so far (Usage).
	EventUsage EventKind = "usage"
	// EventIncomplete is the in-band stream_incomplete event: the stream
	// was cut after content started (Incomplete says why), and no second
	// answer will follow (docs/contract.md section 6.4).
	EventIncomplete EventKind = "stream_incomplete"
	// EventEnd is the last event of an action's stream (End says why):
	// nothing follows it.
	EventEnd EventKind = "end"
)

// StreamEvent is one event of an action's stream as a subscriber sees it.
type StreamEvent struct {
	ActionRef string `json:"action_ref,omitempty"`
	// Seq numbers the action's events from 1, one sequence per action
	// in this hub, with no gaps: a follower resumes after the last Seq it
	// saw.
	Seq     uint64    `json:"seq"`
	Kind    EventKind `json:"kind"`
	Attempt int       `json:"attempt"`
	// Delta is a piece of generated text (EventContent).
	Delta string `json:"delta,omitempty"`
	// Refusal is a piece of refusal text (EventRefusal).
	Refusal string `json:"refusal,omitempty"`
	// ToolCall is a piece of a tool call (EventToolCall).
	ToolCall *exchange.ToolCallDelta `json:"tool_call,omitempty"`
	// FinishReason is the provider's (EventFinish).
	FinishReason string `json:"finish_reason,omitempty"`
	// Usage is the usage so far (EventUsage).
	Usage *providers.Usage `json:"usage,omitempty"`
	// Incomplete says why a committed stream was cut (EventIncomplete).
	Incomplete string `json:"incomplete,omitempty"`
	// End says why the stream ended (EventEnd): the class of the attempt
	// that ended the action (completed, committed_partial, canceled,
	// rejected, content_filtered), or the terminal state End was called
	// with.
	End string `json:"end,omitempty"`
}

// DefaultStreamRetention is how long an action's events stay in the hub's
// replay log after its stream ended, and how long a log that never ended
// stays once nothing has been published to it or followed it.
const DefaultStreamRetention = 10 * time.Minute

// DefaultStreamLogBytes bounds the replay logs of ended streams together;
// past it the oldest ended logs go first. The logs of running actions are
// kept (each is bounded by exchange.MaxResponseBytes).
const DefaultStreamLogBytes = 256 << 20

// eventOverhead is what each event is charged against the byte bound
// besides its text.
const eventOverhead = 64

// Streams is the hub of the streams of the actions this worker runs. It
// receives each attempt's events (through an exchange.ChunkSink, one per
// attempt), numbers them per action from 1, keeps them in a replay log
// until Retention after the stream's end, and hands them to followers
// (Follow: from any point, no loss) and subscribers (Subscribe: from now
// on, through a channel that drops what a slow reader cannot take).
// Nothing reaches it before an attempt's commit boundary, so a log holds
// the events of one attempt only (docs/contract.md section 6.2). Streams is
// safe for concurrent use; the zero value is not usable, use NewStreams.
type Streams struct {
	// Retention is how long an ended stream's log is kept. Zero means
	// DefaultStreamRetention. Set it before use.
	Retention time.Duration
	// MaxBytes bounds the logs of ended streams. Zero means
	// DefaultStreamLogBytes. Set it before use.
	MaxBytes int

	mu        sync.Mutex
	subs      map[string]map[*subscriber]struct{}
	logs      map[string]*actionLog
	bytes     int
	lastSweep time.Time
	// now is the clock, a field so tests can move it.
	now func() time.Time
}

type subscriber struct {
	ch      chan StreamEvent
	dropped int
}

// actionLog is one action's events. Guarded by Streams.mu.
type actionLog struct {
	events  []StreamEvent
	bytes   int
	ended   bool
	endedAt time.Time
	lastAt  time.Time
	// followers counts open cursors; changed is closed, and replaced, on
	// every append.
	followers int
	changed   chan struct{}
}

// NewStreams returns an empty hub.
func NewStreams() *Streams {
	return &Streams{subs: make(map[string]map[*subscriber]struct{}), logs: make(map[string]*actionLog), now: time.Now}
}

func (s *Streams) retention() time.Duration {
	if s.Retention > 0 {
		return s.Retention
	}
	return DefaultStreamRetention
}

func (s *Streams) maxBytes() int {
	if s.MaxBytes > 0 {
		return s.MaxBytes
	}
	return DefaultStreamLogBytes
}

// Subscribe returns the events of actionRef from now on, and a function
// that ends the subscription and reports how many events were dropped.
// buf is the channel's capacity; below 1 means 256. A subscriber that
// falls more than buf events behind loses events (counted) rather than
// stalling the attempt; Follow loses none.
func (s *Streams) Subscribe(actionRef string, buf int) (<-chan StreamEvent, func() (dropped int)) {
	if buf < 1 {
		buf = 256
	}
	sub := &subscriber{ch: make(chan StreamEvent, buf)}
	s.mu.Lock()
	if s.subs[actionRef] == nil {
		s.subs[actionRef] = make(map[*subscriber]struct{})
	}
	s.subs[actionRef][sub] = struct{}{}
	s.mu.Unlock()
	var once sync.Once
	return sub.ch, func() int {
		once.Do(func() {
			s.mu.Lock()
			delete(s.subs[actionRef], sub)
			if len(s.subs[actionRef]) == 0 {
				delete(s.subs, actionRef)
			}
			close(sub.ch)
			s.mu.Unlock()
		})
		s.mu.Lock()
		defer s.mu.Unlock()
		return sub.dropped
	}
}

// ErrStreamClosed is returned by Cursor.Next after Close.
var ErrStreamClosed = errors.New("durallm: stream cursor closed")

// Cursor reads one action's events in order from its replay log. It is
// not safe for concurrent use; Close may be called from any goroutine.
type Cursor struct {
	s    *Streams
	log  *actionLog
	next int
	once sync.Once
	done chan struct{}
}

// Follow returns a cursor over actionRef's events after sequence number
// after (0: from the first). It may be opened before the action starts:
// the events come as they are published. Past the end event Next returns
// ErrStreamEnded. Close it when done.
func (s *Streams) Follow(actionRef string, after uint64) *Cursor {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logLocked(actionRef)
	l.followers++
	return &Cursor{s: s, log: l, next: int(min(after, uint64(len(l.events)))), done: make(chan struct{})}
}

// ErrStreamEnded is returned by Cursor.Next once the end event has been
// read.
var ErrStreamEnded = errors.New("durallm: the stream ended")

// Next returns the next event, waiting for it until ctx ends. After the
// end event it returns ErrStreamEnded; after Close, ErrStreamClosed.
func (c *Cursor) Next(ctx context.Context) (StreamEvent, error) {
	for {
		ev, ok, wait, err := c.Poll()
		if ok || err != nil {
			return ev, err
		}
		select {
		case <-ctx.Done():
			return StreamEvent{}, ctx.Err()
		case <-c.done:
		case <-wait:
		}
	}
}

// Poll returns the next event without waiting (ok), or a channel that is
// closed once there may be one, or the error Next would return.
func (c *Cursor) Poll() (ev StreamEvent, ok bool, wait <-chan struct{}, err error) {
	select {
	case <-c.done:
		return StreamEvent{}, false, nil, ErrStreamClosed
	default:
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	l := c.log
	if c.next < len(l.events) {
		ev := l.events[c.next]
		c.next++
		return ev, true, nil, nil
	}
	if l.ended {
		return StreamEvent{}, false, nil, ErrStreamEnded
	}
	return StreamEvent{}, false, l.changed, nil
}

// Close ends the cursor. It is safe to call more than once.
func (c *Cursor) Close() {
	c.once.Do(func() {
		close(c.done)
		c.s.mu.Lock()
		c.log.followers--
		c.log.lastAt = c.s.now()
		c.s.mu.Unlock()
	})
}

// logLocked returns actionRef's log, creating it. s.mu is held.
func (s *Streams) logLocked(actionRef string) *actionLog {
	now := s.now()
	s.sweepLocked(now)
	l := s.logs[actionRef]
	if l != nil && s.expiredLocked(l, now) {
		s.dropLocked(actionRef, l)
		l = nil
	}
	if l == nil {
		l = &actionLog{changed: make(chan struct{}), lastAt: now}
		s.logs[actionRef] = l
	}
	return l
}

// publish appends ev to its action's log, numbering it, and hands it to
// the subscribers. Nothing is appended after the end event; appended says
// whether ev was.
func (s *Streams) publish(ev StreamEvent) (appended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logLocked(ev.ActionRef)
	if l.ended {
		return false
	}
	ev.Seq = uint64(len(l.events)) + 1
	l.events = append(l.events, ev)
	size := eventOverhead + len(ev.Delta) + len(ev.Refusal)
	if ev.ToolCall != nil {
		size += len(ev.ToolCall.ID) + len(ev.ToolCall.Name) + len(ev.ToolCall.Arguments)
	}
	l.bytes += size
	now := s.now()
	l.lastAt = now
	if ev.Kind == EventEnd {
		l.ended, l.endedAt = true, now
		s.bytes += l.bytes
		s.boundLocked()
	}
	close(l.changed)
	l.changed = make(chan struct{})
	for sub := range s.subs[ev.ActionRef] {
		select {
		case sub.ch <- ev:
		default:
			sub.dropped++
		}
	}
	return true
}

// End ends actionRef's stream with an end event saying why (a terminal
// state): followers read what is left and stop. It is a no-op on a stream
// that already ended. The worker's attempts end the stream themselves when
// their class ends the action; End is for whoever learns the end from the
// action's result.
func (s *Streams) End(actionRef, why string) {
	_ = s.publish(StreamEvent{ActionRef: actionRef, Kind: EventEnd, End: why})
}

// sweepLocked drops the logs past their retention, at most once a tenth
// of the retention. s.mu is held.
func (s *Streams) sweepLocked(now time.Time) {
	keep := s.retention()
	if now.Sub(s.lastSweep) < keep/10 {
		return
	}
	s.lastSweep = now
	for ref, l := range s.logs {
		if s.expiredLocked(l, now) {
			s.dropLocked(ref, l)
		}
	}
}

// expiredLocked reports whether l is past its retention: ended that long
// ago, or never ended and idle that long with nobody following it.
func (s *Streams) expiredLocked(l *actionLog, now time.Time) bool {
	keep := s.retention()
	if l.ended {
		return now.Sub(l.endedAt) >= keep
	}
	return l.followers == 0 && now.Sub(l.lastAt) >= keep
}

func (s *Streams) dropLocked(ref string, l *actionLog) {
	if l.ended {
		s.bytes -= l.bytes
	}
	delete(s.logs, ref)
}

// boundLocked drops the oldest ended logs while they are over MaxBytes.
// s.mu is held.
func (s *Streams) boundLocked() {
	for s.bytes > s.maxBytes() {
		var oldest string
		var at time.Time
		for ref, l := range s.logs {
			if l.ended && (oldest == "" || l.endedAt.Before(at)) {
				oldest, at = ref, l.endedAt
			}
		}
		if oldest == "" {
			return
		}
		s.dropLocked(oldest, s.logs[oldest])
	}
}

// forAttempt returns the provider-layer sink for one attempt.
func (s *Streams) forAttempt(actionRef string, attempt int) *attemptSink {
	return &attemptSink{s: s, ref: actionRef, n: attempt}
}

// attemptEnded ends the action's stream when the attempt's class ends the
// action whatever the workflow decides: its answer (complete or cut), its
// cancellation, or the request's rejection. Other classes leave the
// stream open for the next attempt, here or on another worker.
func (s *Streams) attemptEnded(actionRef string, class evidence.Class) {
	switch class {
	case evidence.Completed, evidence.CommittedPartial, evidence.Canceled, evidence.Rejected, evidence.ContentFiltered:
		s.End(actionRef, string(class))
	}
}

// attemptSink publishes one attempt's stream to the hub and records the
// pieces of content it published (providers.Pieces), for the response:
// from it and the response, a reader without the hub's log rebuilds the
// same deltas. Its methods are called on one goroutine, in order
// (exchange.Sink).
type attemptSink struct {
	s      *Streams
	ref    string
	n      int
	pieces providers.Pieces
}

func (a *attemptSink) Delta(text string) {
	a.content(StreamEvent{ActionRef: a.ref, Attempt: a.n, Kind: EventContent, Delta: text}, providers.Piece{Kind: providers.PieceText, Len: len(text)})
}

func (a *attemptSink) Chunk(c exchange.Chunk) {
	if c.Text != "" {
		a.content(StreamEvent{ActionRef: a.ref, Attempt: a.n, Kind: EventContent, Delta: c.Text}, providers.Piece{Kind: providers.PieceText, Len: len(c.Text)})
	}
	if c.Refusal != "" {
		a.content(StreamEvent{ActionRef: a.ref, Attempt: a.n, Kind: EventRefusal, Refusal: c.Refusal}, providers.Piece{Kind: providers.PieceRefusal, Len: len(c.Refusal)})
	}
	for i := range c.ToolCalls {
		t := &c.ToolCalls[i]
		a.content(StreamEvent{ActionRef: a.ref, Attempt: a.n, Kind: EventToolCall, ToolCall: t},
			providers.Piece{Kind: providers.PieceToolCall, Call: t.Index, ID: t.ID != "", Type: t.Type != "", Name: t.Name != "", Len: len(t.Arguments)})
	}
	if c.FinishReason != "" {
		_ = a.s.publish(StreamEvent{ActionRef: a.ref, Attempt: a.n, Kind: EventFinish, FinishReason: c.FinishReason})
	}
	if c.Usage != nil {
		_ = a.s.publish(StreamEvent{ActionRef: a.ref, Attempt: a.n, Kind: EventUsage, Usage: c.Usage})
	}
}

// content publishes a content event and records its piece if the hub
// took it.
func (a *attemptSink) content(ev StreamEvent, p providers.Piece) {
	if a.s.publish(ev) {
		a.pieces = a.pieces.Append(p)
	}
}

func (a *attemptSink) Incomplete(reason string) {
	_ = a.s.publish(StreamEvent{ActionRef: a.ref, Attempt: a.n, Kind: EventIncomplete, Incomplete: reason})
}
