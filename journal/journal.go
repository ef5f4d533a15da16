// Package journal is the attempt journal (docs/contract.md section 5):
// what a worker saw of each attempt, written by the worker itself before
// the activity reports to Temporal, so that an answer a worker had in its
// hands survives the worker, or Temporal, losing the report. The
// built-in reconciler (activities.Activities.Reconcile) reads it first
// for every ambiguous attempt: a received response settles the attempt
// as completed, by the journal, with no person involved.
//
// Every worker must be able to read every other worker's journal: the
// worker that ran an attempt may be the one that died. Dir keeps it on a
// file system (the embedded default keeps it in the data directory;
// workers on several machines need a shared one); Postgres keeps it in
// PostgreSQL, in a database of its own (production: the server the
// Temporal cluster uses).
//
// The journal holds generated text. It is never logged; Dir's files are
// readable by the worker's user only; with a keyring (Dir.Keys,
// Postgres.Keys) entries are sealed with the payload keys, and an entry
// that is not sealed is refused (ErrUnsealed). Every backend reads an
// entry only under its own attempt id (ErrOtherAttempt).
//
// Entries expire: Sweeper deletes those whose action closed longer than a
// retention ago (the worker runs one). A Bound bounds the journal's size:
// at the bound a new attempt is refused with ErrFull and nothing is
// dropped.
package journal

import (
	"context"
	"errors"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

// State is what the journal knows of an attempt.
type State string

// The states an entry records. An attempt with no entry was never seen
// by any worker's journal: it was never sent, or its worker died before
// writing, or the journal was unreachable when it tried. The journal
// cannot tell which, so a missing entry proves nothing (docs/contract.md
// section 5.5 says why no intent record is written before sending).
const (
	// Sent: the request's HEADERS were on the wire and the exchange had
	// not ended when the worker wrote this. The worker renews the entry
	// (a new At) every few seconds while the exchange runs: while it
	// does, the attempt may still end on it, until Entry.Deadline.
	Sent State = "sent"
	// NotProcessed: the exchange ended and the engine proved that the
	// provider did not process the request: no byte of it left (class
	// unsent), or the server refused it (class refused: GOAWAY below its
	// stream, REFUSED_STREAM). The attempt was not executed.
	NotProcessed State = "not_processed"
	// Received: a usable response, complete or a committed partial,
	// reached the worker. Entry.Response holds it.
	Received State = "received"
	// EndedUnanswered: the exchange ended after the request may have
	// left, with no usable response (Entry.Reason says how). This is no
	// proof that the provider did not run it.
	EndedUnanswered State = "ended_unanswered"
)

// Entry is one attempt's record.
type Entry struct {
	AttemptID string `json:"attempt_id"`
	ActionRef string `json:"action_ref"`
	Attempt   int    `json:"attempt"`
	State     State  `json:"state"`
	// Class and Reason are the attempt's classification as the worker saw
	// it.
	Class  evidence.Class `json:"class"`
	Reason string         `json:"reason,omitempty"`
	// Response is the answer, for Received.
	Response *providers.Response `json:"response,omitempty"`
	// At is when the worker wrote the entry.
	At time.Time `json:"at"`
	// Remaining, for Sent, is how long the attempt's worker still gives
	// it (to the activity's own deadline) at the time of writing: until
	// then a Sent attempt may still end on a live worker. A reader adds
	// it to its own clock when it sees the entry change, so the writer's
	// clock never meets the reader's.
	Remaining time.Duration `json:"remaining,omitempty"`
	// Renewal, for Sent, is the longest the worker may take, from At, to
	// land its next renewal: its lease, plus the bound it gives a renewal
	// write (a renewal that lands is never later than that). A reader
	// that has seen the entry and sees no change for that long, on its
	// own clock, may take the worker for dead; zero in an entry from
	// before Renewal.
	Renewal time.Duration `json:"renewal,omitempty"`
	// Deadline, for Sent, is the same instant on the writer's clock. It
	// is kept for entries written before Remaining existed, and read only
	// as Deadline minus At (both the writer's).
	Deadline time.Time `json:"deadline,omitempty"`
}

// Ended reports whether the entry records the end of the exchange.
func (e Entry) Ended() bool { return e.State != Sent }

// Journal records and looks up attempts by attempt id. Implementations
// are safe for concurrent use by many workers.
type Journal interface {
	// Record writes e durably before it returns: once it has returned
	// nil, a Lookup by any worker finds it. An entry in an end state
	// replaces any earlier entry of the attempt. An entry in state Sent
	// replaces only a Sent one (its worker renews it while the exchange
	// runs) and is otherwise dropped without error, so a Sent written
	// late never hides the end of the exchange. That holds for a Sent
	// written at the same time as the end, or one that lands after it,
	// and the backend itself must make it so: a worker does not wait for
	// a renewal in flight (a journal write may hang; it stops waiting at
	// a timeout) before it writes the end, and an abandoned write may
	// still land later.
	Record(ctx context.Context, e Entry) error
	// Lookup returns the attempt's entry, ok false when there is none.
	Lookup(ctx context.Context, attemptID string) (e Entry, ok bool, err error)
}

// ErrBadAttemptID is returned for an attempt id the journal cannot key an
// entry by (empty, or with characters other than letters, digits, '.',
// '_' and '-').
var ErrBadAttemptID = errors.New("journal: attempt id is not a valid key")

func validID(id string) error {
	if id == "" || len(id) > 200 {
		return ErrBadAttemptID
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return ErrBadAttemptID
		}
	}
	if id[0] == '.' {
		return ErrBadAttemptID
	}
	return nil
}
