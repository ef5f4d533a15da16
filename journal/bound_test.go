package journal

import (
	"context"
	"testing"
	"time"
)

// Measuring the journal reads all of it (79 ms at 20,000 entries, and
// linear): a Record never waits for a measurement, and one that ends
// applies, with what was written while it ran.
func TestARecordIsNotHeldByAMeasurementInProgress(t *testing.T) {
	b := &Bound{MaxEntries: 10, Refresh: time.Nanosecond}
	started, release := make(chan struct{}, 1), make(chan struct{})
	measure := func(context.Context) (Usage, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return Usage{Entries: 10}, nil
	}
	checked := make(chan error, 1)
	go func() {
		_, err := b.full(context.Background(), measure)
		checked <- err
	}()
	select {
	case err := <-checked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a Record waited for the measurement in progress")
	}
	<-started
	b.wrote(true, true, 100) // while the measurement runs
	close(release)
	// The measurement applies once it ends: at the bound.
	for give := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		full, err := b.full(context.Background(), measure)
		if err != nil {
			t.Fatal(err)
		}
		if full {
			break
		}
		if time.Now().After(give) {
			t.Fatal("the measurement never applied")
		}
	}
}

// What a measurement saw of the writes made while it ran is unknown: the
// count the journal kept stands when it is possible, else the nearest.
func TestSettleAMeasurement(t *testing.T) {
	for _, tt := range []struct {
		name                            string
		counted, measured, during, want int64
	}{
		{"one worker: the measurement saw the write made meanwhile", 10, 10, 1, 10},
		{"one worker: it did not", 10, 9, 1, 10},
		{"others wrote too", 10, 14, 1, 14},
		{"others deleted, or entries were replaced by smaller ones", 10, 4, 1, 5},
		{"a delete meanwhile, seen or not", 8, 9, -1, 8},
		{"nothing meanwhile", 3, 7, 0, 7},
	} {
		if got := settle(tt.counted, tt.measured, tt.during); got != tt.want {
			t.Errorf("%s: settle(%d, %d, %d) = %d, want %d", tt.name, tt.counted, tt.measured, tt.during, got, tt.want)
		}
	}
}
