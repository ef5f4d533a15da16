package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrFull is returned (wrapped) by Record for an attempt that has no entry
// yet when the journal is at its bound (Bound). Nothing already in the
// journal is dropped to make room: the new attempt goes unjournaled, and
// if its report to Temporal is lost its ambiguity goes to a person, as
// without a journal. The end of an attempt that already has an entry is
// still written.
var ErrFull = errors.New("journal: at its size bound; the attempt is not journaled")

// DefaultRefresh is how long a Bound trusts a measurement of the journal.
const DefaultRefresh = 10 * time.Second

// Bound is a journal's size bound: at MaxEntries entries or MaxBytes bytes
// of stored entries, a Record that would add an entry fails with ErrFull.
// Give one Bound to one journal (Dir.Bound, Postgres.Bound); it keeps that
// journal's measurement and is safe for concurrent use.
//
// Measuring the journal reads all of it (a directory listing, a scan of
// the table), so a Bound measures at most once per Refresh and counts what
// it admitted since: the journal's own writes keep it exact in one worker,
// and workers sharing a journal may together pass the bound by what the
// others wrote in one Refresh. The bytes of an entry that replaces
// another are counted whole until the next measurement, which errs toward
// refusing early. Deleting entries (the sweeper) makes the next Record
// measure again.
type Bound struct {
	// MaxEntries is the most entries; zero means no limit.
	MaxEntries int64
	// MaxBytes is the most bytes of stored entries (as encoded, encrypted
	// when encryption is on); zero means no limit.
	MaxBytes int64
	// Refresh is how long a measurement is trusted; zero means
	// DefaultRefresh.
	Refresh time.Duration

	mu       sync.Mutex
	measured time.Time // zero: measure on the next check
	usage    Usage
}

// Usage is how much a journal holds.
type Usage struct {
	Entries int64
	Bytes   int64
}

// full reports whether the journal is at the bound, measuring it with
// measure when the last measurement is older than Refresh. A nil Bound is
// never full.
func (b *Bound) full(ctx context.Context, measure func(context.Context) (Usage, error)) (bool, error) {
	if b == nil || (b.MaxEntries <= 0 && b.MaxBytes <= 0) {
		return false, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	refresh := b.Refresh
	if refresh <= 0 {
		refresh = DefaultRefresh
	}
	if b.measured.IsZero() || time.Since(b.measured) >= refresh {
		u, err := measure(ctx)
		if err != nil {
			return false, fmt.Errorf("journal: measure its size: %w", err)
		}
		b.usage, b.measured = u, time.Now()
	}
	return (b.MaxEntries > 0 && b.usage.Entries >= b.MaxEntries) || (b.MaxBytes > 0 && b.usage.Bytes >= b.MaxBytes), nil
}

// wrote counts an entry of n bytes the journal just wrote: added says
// whether it was a new entry rather than a replacement, ended whether it
// records the end. A Sent renewed in place is not counted: it replaces one
// of about its own size, and a worker renews it every few seconds.
func (b *Bound) wrote(added, ended bool, n int) {
	if b == nil || (!added && !ended) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if added {
		b.usage.Entries++
	}
	b.usage.Bytes += int64(n)
}

// forget makes the next check measure again (after entries were deleted).
func (b *Bound) forget() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.measured = time.Time{}
}
