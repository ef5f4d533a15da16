package testproc

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Busy makes the machine busy, as far as this process can tell, until
// the returned function is called or the test ends: the process gets one
// CPU (GOMAXPROCS 1) and n goroutines spin on it, so that anything else
// it runs gets about 1/(n+1) of a CPU and takes n+1 times as long in wall
// time, as on a loaded machine. The Go scheduler preempts the spinners,
// so everything still runs.
func Busy(t testing.TB, n int) (idle func()) {
	t.Helper()
	prev := runtime.GOMAXPROCS(1)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for !stop.Load() {
			}
		})
	}
	var once sync.Once
	idle = func() {
		once.Do(func() {
			stop.Store(true)
			wg.Wait()
			runtime.GOMAXPROCS(prev)
		})
	}
	t.Cleanup(idle)
	return idle
}
