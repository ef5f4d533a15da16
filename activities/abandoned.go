package activities

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// DefaultMaxAbandoned is how many journal and result-store operations a
// worker may have stopped waiting for while they have not returned
// (AbandonedOps.Max).
const DefaultMaxAbandoned = 32

// ErrJournalStuck is returned (wrapped) for a journal or result-store
// operation that is not started because the worker's cap of operations it
// stopped waiting for, still unreturned, is reached (AbandonedOps).
var ErrJournalStuck = errors.New("durallm: the attempt journal (or result store) is stuck: the operations the worker stopped waiting for have not returned")

// AbandonedOps bounds, for one worker, the journal and result-store
// operations it stopped waiting for (a write past its bound, a reconciler's
// read past its own) that have not returned. A journal stuck in the kernel
// (an NFS hard mount, a disk that stopped answering) holds an OS thread in
// each: without a bound they pile up with every attempt until the process
// runs out of threads. At Max, no new operation is started (it fails with
// ErrJournalStuck, a journal failure like any other) until some return:
// at most Max, plus those in flight when the cap is reached, ever block.
// The zero value is usable; it is safe for concurrent use. Share one per
// worker, across its attempts.
type AbandonedOps struct {
	// Max is the cap. Zero means DefaultMaxAbandoned.
	Max int

	n atomic.Int64
}

// Count is how many operations the worker stopped waiting for have not
// returned.
func (o *AbandonedOps) Count() int64 { return o.n.Load() }

// Err is nil below the cap; at it, an error wrapping ErrJournalStuck that
// says how many, for /readyz.
func (o *AbandonedOps) Err() error {
	max := o.Max
	if max <= 0 {
		max = DefaultMaxAbandoned
	}
	if n := o.n.Load(); n >= int64(max) {
		return fmt.Errorf("%w (%d of them, the cap): new attempts go unjournaled until they return", ErrJournalStuck, n)
	}
	return nil
}

// abandoned is the worker's AbandonedOps: Abandoned, or one of its own.
func (a *Activities) abandoned() *AbandonedOps {
	if a.Abandoned != nil {
		return a.Abandoned
	}
	if o := a.ownAbandoned.Load(); o != nil {
		return o
	}
	a.ownAbandoned.CompareAndSwap(nil, &AbandonedOps{})
	return a.ownAbandoned.Load()
}

// The states of one bounded operation.
const (
	opRunning int32 = iota
	opReturned
	opAbandoned
)

// bounded runs op on a goroutine of its own and waits for it until by at
// the latest, and until ctx ends unless detach is set (a write: a worker
// stop must not cut the record of what it saw; a read is not worth
// finishing once its reader has gone). The op's context ends then too,
// but Dir's fsync ignores its context and a half-open connection may
// outlast it, so bounded stops waiting: the op is left to finish or fail
// by itself, counted in the worker's AbandonedOps until it returns. At
// the cap op is not started at all (ErrJournalStuck). timedOut wraps the
// error of an op it stopped waiting for.
func (a *Activities) bounded(ctx context.Context, by time.Time, detach bool, timedOut error, op func(context.Context) error) error {
	ab := a.abandoned()
	if err := ab.Err(); err != nil {
		return err
	}
	base := ctx
	if detach {
		base = context.WithoutCancel(ctx)
	}
	octx, cancel := context.WithDeadline(base, by)
	defer cancel()
	var state atomic.Int32
	done := make(chan error, 1)
	tel := a.Telemetry
	go func() {
		err := op(octx)
		if !state.CompareAndSwap(opRunning, opReturned) {
			ab.n.Add(-1)
			tel.Abandoned(context.Background(), -1)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-octx.Done():
		if !state.CompareAndSwap(opRunning, opAbandoned) {
			return <-done // it returned as the wait ended
		}
		ab.n.Add(1)
		tel.Abandoned(context.Background(), 1)
		return fmt.Errorf("%w: %w", timedOut, octx.Err())
	}
}
