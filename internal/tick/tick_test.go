package tick

import (
	"sync/atomic"
	"testing"
	"time"
)

// f runs until stop, and never once stop has returned, however often
// stop is called.
func TestEveryNeverCallsFAfterStopReturns(t *testing.T) {
	var calls atomic.Int64
	ran := make(chan struct{}, 1)
	stop := Every(time.Millisecond, nil, func() {
		calls.Add(1)
		select {
		case ran <- struct{}{}:
		default:
		}
	})
	<-ran
	stop()
	n := calls.Load()
	time.Sleep(20 * time.Millisecond)
	stop()
	if got := calls.Load(); got != n {
		t.Fatalf("f ran %d times after stop returned", got-n)
	}
}

// Closing until ends the calls; stop still returns.
func TestEveryEndsWhenUntilCloses(t *testing.T) {
	until := make(chan struct{})
	var calls atomic.Int64
	stop := Every(time.Millisecond, until, func() { calls.Add(1) })
	close(until)
	stop()
	n := calls.Load()
	time.Sleep(20 * time.Millisecond)
	if got := calls.Load(); got != n {
		t.Fatalf("f ran %d times after until closed and stop returned", got-n)
	}
}
