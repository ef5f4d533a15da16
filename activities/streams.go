package activities

import (
	"sync"

	"github.com/durallm/durallm/providers/exchange"
)

// StreamEvent is one event of an action's stream as a subscriber sees it.
type StreamEvent struct {
	ActionRef string `json:"action_ref"`
	Attempt   int    `json:"attempt"`
	// Delta is a piece of generated text, empty on an Incomplete event.
	Delta string `json:"delta,omitempty"`
	// Incomplete is set on the in-band stream_incomplete event: the stream
	// was cut after content started, and no second answer will follow.
	Incomplete string `json:"incomplete,omitempty"`
}

// Streams is the hub of the streams of the actions this worker runs: it
// fans each attempt's deltas (received through a exchange.Sink, one per
// attempt) out to in-process subscribers, by action.
// It is for app code that runs its own worker. A subscriber that falls
// more than its buffer behind loses deltas (counted in Dropped) rather
// than stalling the attempt; the action's final response always carries
// the whole text. Streams is safe for concurrent use; the zero value is not
// usable, use NewStreams.
type Streams struct {
	mu   sync.Mutex
	subs map[string]map[*subscriber]struct{}
}

type subscriber struct {
	ch      chan StreamEvent
	dropped int
}

// NewStreams returns an empty registry.
func NewStreams() *Streams { return &Streams{subs: make(map[string]map[*subscriber]struct{})} }

// Subscribe returns the events of actionRef from now on, and a function
// that ends the subscription and reports how many events were dropped.
// buf is the channel's capacity; below 1 means 256.
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

func (s *Streams) publish(ev StreamEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs[ev.ActionRef] {
		select {
		case sub.ch <- ev:
		default:
			sub.dropped++
		}
	}
}

// forAttempt returns the provider-layer sink for one attempt.
func (s *Streams) forAttempt(actionRef string, attempt int) exchange.Sink {
	return attemptSink{s: s, ref: actionRef, n: attempt}
}

type attemptSink struct {
	s   *Streams
	ref string
	n   int
}

func (a attemptSink) Delta(text string) {
	a.s.publish(StreamEvent{ActionRef: a.ref, Attempt: a.n, Delta: text})
}

func (a attemptSink) Incomplete(reason string) {
	a.s.publish(StreamEvent{ActionRef: a.ref, Attempt: a.n, Incomplete: reason})
}
