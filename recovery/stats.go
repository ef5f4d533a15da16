package recovery

import (
	"sync"
	"sync/atomic"

	"github.com/durallm/durallm/evidence"
)

// Stats are the engine's counters since it was created. They feed the
// project's metrics; none of them holds content.
type Stats struct {
	// ConnsOpened counts connections dialed and set up.
	ConnsOpened int64
	// GoAways counts GOAWAY frames received, by ErrCode.Label: the RFC
	// name, or UNKNOWN for any unassigned code, because the keys become
	// the http2.error_code metric attribute and the peer chooses the code.
	GoAways map[string]int64
	// Quarantines counts connections quarantined after a 421.
	Quarantines int64
	// TransportReplays counts streams that re-sent an attempt already
	// sent (always 0 for the engine's own sends; see Evidence).
	TransportReplays int64
	// ObserverLost counts connections whose framing could not be followed.
	ObserverLost int64
	// MaybeSent counts attempts whose context ended while the transport
	// held the request and the write barrier could not prove its HEADERS
	// stayed (Evidence.MaybeSent): each is ambiguous instead of unsent.
	MaybeSent int64
	// Attempts counts finished attempts by classification.
	Attempts map[evidence.Class]int64
	// RefusedStreamFramesDropped counts frames the HTTP/2 client wrote for
	// a stream that a GOAWAY received on its connection had already
	// refused (above the last-stream id), which the engine kept off the
	// wire (docs/recovery.md, "Nothing for a refused stream").
	RefusedStreamFramesDropped int64

	// HTTP/1.1 keep-alive decisions (the keep-alive race, docs/recovery.md).
	// HTTP1ConnsOpened counts HTTP/1.1 connections dialed (also in
	// ConnsOpened).
	HTTP1ConnsOpened int64
	// HTTP1Reused counts requests sent on a kept-alive connection that
	// passed the usability check.
	HTTP1Reused int64
	// HTTP1ClosedIdle counts idle connections the usability check found
	// closed (or sent to) by the server: discarded unwritten, and a new
	// connection dialed instead.
	HTTP1ClosedIdle int64
	// HTTP1Expired counts idle connections the engine closed at its own
	// idle timeout (Config.HTTP1IdleTimeout), before the server could.
	HTTP1Expired int64
	// HTTP1RaceLost counts requests written on a reused connection that
	// the server then closed without a byte of answer: ambiguous, since
	// HTTP/1.1 cannot prove such a request unprocessed.
	HTTP1RaceLost int64
}

type stats struct {
	connsOpened  atomic.Int64
	quarantines  atomic.Int64
	replays      atomic.Int64
	observerLost atomic.Int64
	maybeSent    atomic.Int64
	dropped      atomic.Int64
	h1Opened     atomic.Int64
	h1Reused     atomic.Int64
	h1ClosedIdle atomic.Int64
	h1Expired    atomic.Int64
	h1RaceLost   atomic.Int64

	mu       sync.Mutex
	goAways  map[string]int64
	attempts map[evidence.Class]int64
}

func (s *stats) goAway(code evidence.ErrCode) {
	s.mu.Lock()
	if s.goAways == nil {
		s.goAways = make(map[string]int64)
	}
	s.goAways[code.Label()]++
	s.mu.Unlock()
}

func (s *stats) classified(c evidence.Class) {
	s.mu.Lock()
	if s.attempts == nil {
		s.attempts = make(map[evidence.Class]int64)
	}
	s.attempts[c]++
	s.mu.Unlock()
}

// Stats returns a snapshot of the engine's counters.
func (e *Engine) Stats() Stats {
	s := &e.stats
	out := Stats{
		ConnsOpened:                s.connsOpened.Load(),
		Quarantines:                s.quarantines.Load(),
		TransportReplays:           s.replays.Load(),
		ObserverLost:               s.observerLost.Load(),
		MaybeSent:                  s.maybeSent.Load(),
		RefusedStreamFramesDropped: s.dropped.Load(),
		HTTP1ConnsOpened:           s.h1Opened.Load(),
		HTTP1Reused:                s.h1Reused.Load(),
		HTTP1ClosedIdle:            s.h1ClosedIdle.Load(),
		HTTP1Expired:               s.h1Expired.Load(),
		HTTP1RaceLost:              s.h1RaceLost.Load(),
		GoAways:                    make(map[string]int64),
		Attempts:                   make(map[evidence.Class]int64),
	}
	s.mu.Lock()
	for k, v := range s.goAways {
		out.GoAways[k] = v
	}
	for k, v := range s.attempts {
		out.Attempts[k] = v
	}
	s.mu.Unlock()
	return out
}
