//go:build !nodev

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/durallm/durallm/internal/chaos"
)

func runChaos(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("chaos", "[flags]", stderr)
	actions := fs.Int("actions", 500, "actions to run")
	conc := fs.Int("concurrency", 32, "callers running actions at once")
	every := fs.Duration("reload-every", 2*time.Second, "graceful haproxy reload interval")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole run")
	bin := fs.String("haproxy", "haproxy", "haproxy binary (Debian: apt-get install haproxy)")
	kill := fs.Bool("kill-worker", false, "also run a worker process and SIGKILL it halfway (then restart it)")
	restart := fs.Bool("restart-server", false, "restart the embedded Temporal server three quarters of the way through")
	faults := fs.Float64("faults", 0, "fraction of requests (0 to 1) the provider behind haproxy answers with a fault (429, 503, 500, 400, 421, 504, empty 2xx, REFUSED_STREAM, reset, closed connection, GOAWAY above or after processing)")
	stream := fs.Bool("stream", false, "stream every action (server-sent events); with --faults, stream stalls and cuts join the mix")
	record := fs.Bool("provider-record", false, "give the route a provider record (provider_record: stored_completions): the provider stores what it generates, and the built-in reconciler settles attempts no worker saw end from it")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *faults < 0 || *faults > 1 {
		fmt.Fprintf(stderr, "durallm chaos: --faults must be between 0 and 1, got %g\n", *faults)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, chaos.Options{Actions: *actions, Concurrency: *conc, ReloadEvery: *every, Timeout: *timeout, HAProxy: *bin, Progress: stderr, KillWorker: *kill, RestartServer: *restart, Faults: *faults, Stream: *stream, ProviderRecord: *record})
	if err != nil {
		fmt.Fprintf(stderr, "durallm chaos: %v\n", err)
		return exitError
	}
	rep.Print(stdout)
	if rep.Failed() {
		return exitFailed
	}
	return exitOK
}
