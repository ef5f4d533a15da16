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

// measureTimeout bounds one measurement of the journal.
const measureTimeout = time.Minute

// Bound is a journal's size bound: at MaxEntries entries or MaxBytes bytes
// of stored entries, a Record that would add an entry fails with ErrFull.
// Give one Bound to one journal (Dir.Bound, Postgres.Bound); it keeps that
// journal's measurement and is safe for concurrent use.
//
// Measuring the journal reads all of it (a directory listing, a scan of
// the table), so a Bound measures in the background, at most once per
// Refresh, and never makes a Record wait for it: a Record is checked
// against the last measurement plus what the journal admitted since
// (until the first measurement ends, what it admitted alone). The
// journal's own writes keep it exact in one worker, and workers sharing a
// journal may together pass the bound by what the others wrote in one
// Refresh. The bytes of an entry that replaces another are counted whole
// until the next measurement, which errs toward refusing early. Deleting
// entries (the sweeper) counts them off at once and makes the next Record
// start a measurement. While measuring fails, the journal is held at its
// bound: a Record that would add an entry fails with the measurement's
// error (wrapped) instead of ErrFull, one for an attempt that has an
// entry (its end, a renewal) is written, and each starts another
// measurement.
type Bound struct {
	// MaxEntries is the most entries; zero means no limit.
	MaxEntries int64
	// MaxBytes is the most bytes of stored entries (as encoded, encrypted
	// when encryption is on); zero means no limit.
	MaxBytes int64
	// Refresh is how long a measurement is trusted; zero means
	// DefaultRefresh.
	Refresh time.Duration

	mu        sync.Mutex
	measured  time.Time // when the last measurement started; zero: start one on the next check
	measuring bool
	again     bool  // forgotten while measuring: measure again once it ends
	usage     Usage // the last measurement, plus what was written since it started
	during    Usage // what was written while the measurement runs
	err       error // the last measurement's failure, until one succeeds
	// measureFor, when set (by tests), measures instead of the journal.
	measureFor func(context.Context) (Usage, error)
}

// Usage is how much a journal holds.
type Usage struct {
	Entries int64
	Bytes   int64
}

// full reports whether the journal is at the bound, starting a
// measurement with measure when the last one is older than Refresh. It
// never waits for a measurement. While measuring fails the journal counts
// as full, and err is the failure (wrapped): the Record refuses a new
// attempt with it rather than ErrFull. A nil Bound is never full.
func (b *Bound) full(_ context.Context, measure func(context.Context) (Usage, error)) (full bool, err error) {
	if b == nil || (b.MaxEntries <= 0 && b.MaxBytes <= 0) {
		return false, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	refresh := b.Refresh
	if refresh <= 0 {
		refresh = DefaultRefresh
	}
	if !b.measuring && (b.measured.IsZero() || time.Since(b.measured) >= refresh) {
		b.measuring, b.measured, b.during = true, time.Now(), Usage{}
		if b.measureFor != nil {
			measure = b.measureFor
		}
		go b.measure(measure)
	}
	if b.err != nil {
		return true, fmt.Errorf("journal: measure its size: %w", b.err)
	}
	return (b.MaxEntries > 0 && b.usage.Entries >= b.MaxEntries) || (b.MaxBytes > 0 && b.usage.Bytes >= b.MaxBytes), nil
}

// measure runs one measurement, on a context of its own: the Record that
// started it does not wait for it.
func (b *Bound) measure(measure func(context.Context) (Usage, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), measureTimeout)
	defer cancel()
	u, err := measure(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.measuring = false
	if b.again {
		b.again, b.measured = false, time.Time{}
	}
	if err != nil {
		b.err, b.measured = err, time.Time{}
		return
	}
	b.err = nil
	b.usage = Usage{Entries: settle(b.usage.Entries, u.Entries, b.during.Entries), Bytes: settle(b.usage.Bytes, u.Bytes, b.during.Bytes)}
}

// settle is the usage once a measurement ends: the measurement saw some,
// all or none of what this journal wrote (or deleted) while it ran, so the
// truth is between measured and measured+during. The count this journal
// kept (counted) is exact when nobody else writes, so it stands where it
// falls in that range; outside it, what others did shows, and the nearest
// end of the range stands.
func settle(counted, measured, during int64) int64 {
	lo, hi := min(measured, measured+during), max(measured, measured+during)
	return min(max(counted, lo), hi)
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
	d := Usage{Bytes: int64(n)}
	if added {
		d.Entries = 1
	}
	b.add(d)
}

// deleted counts entries the journal just deleted, and makes the next
// check measure again.
func (b *Bound) deleted(u Usage) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.add(Usage{Entries: -u.Entries, Bytes: -u.Bytes})
	b.usage.Entries, b.usage.Bytes = max(b.usage.Entries, 0), max(b.usage.Bytes, 0)
	b.measured = time.Time{}
	b.again = b.measuring
}

func (b *Bound) add(d Usage) {
	b.usage.Entries += d.Entries
	b.usage.Bytes += d.Bytes
	if b.measuring {
		b.during.Entries += d.Entries
		b.during.Bytes += d.Bytes
	}
}
