// Package tick runs a function at a fixed interval on a goroutine of its
// own, until told to stop: the heartbeats of an activity, the reloads of
// a chaos run.
package tick

import (
	"sync"
	"time"
)

// Every calls f every d, the first time after one interval, until stop
// is called or until is closed (nil: never). stop waits for a call in
// progress, so f never runs after stop returns and what f writes is then
// safe to read; calling it again does nothing more.
func Every(d time.Duration, until <-chan struct{}, f func()) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-until:
				return
			case <-t.C:
			}
			f()
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-finished
	}
}
