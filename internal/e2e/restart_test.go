package e2e_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// The Temporal server stops while a long stream is in flight and comes
// back after the stream has ended on the live worker. The SDK gives up
// heartbeating while the server is away and cancels the activity's
// context; the attempt must not be cut by that (Temporal lost track of it,
// nobody asked to stop it): it runs to its end, the journal keeps the
// answer, and the action ends with exactly the provider's answer, executed
// once, with no person involved: completed, if the worker's retried report
// reaches the server in time, or reconciled by the journal otherwise.
func TestE2EServerRestartDuringALongStreamIsSettledByTheWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a Temporal server")
	}
	ctx := context.Background()
	opts := devserver.Options{
		DataDir: filepath.Join(t.TempDir(), "data"), FrontendPort: devserver.FreePort, DisableUI: true,
		SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler),
	}
	srv, err := devserver.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	_, port, _ := net.SplitHostPort(srv.FrontendHostPort())
	opts.FrontendPort, _ = strconv.Atoi(port)

	tc, err := client.Dial(client.Options{HostPort: srv.FrontendHostPort(), Namespace: srv.Namespace(), Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.Close)
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	s := &stack{t: t, p: p, tc: tc, tq: "durallm-restart"}
	s.c = durallm.NewClient(tc, s.tq)
	dir := filepath.Join(t.TempDir(), "journal")
	s.startWorker(func(o *worker.Options) { o.Journal = journal.Dir{Path: dir} })

	const answer = "a long answer that outlives the Temporal server"
	release := make(chan struct{})
	p.Push(providertest.Answer(answer).MidStreamWaitFor(release))
	a, err := s.c.Start(ctx, "long-stream", actionInput(true))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return p.ExecutedCount("long-stream") == 1 })

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	// Past the heartbeat timeout (5 s): the SDK has given up heartbeating
	// and canceled the activity's context by now.
	time.Sleep(8 * time.Second)
	close(release)
	waitFor(t, func() bool {
		e, ok, _ := journal.Dir{Path: dir}.Lookup(ctx, entryID(t, dir))
		return ok && e.State == journal.Received
	})
	if srv, err = devserver.Start(ctx, opts); err != nil {
		t.Fatal(err)
	}

	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := a.Result(rctx)
	if err != nil {
		t.Fatalf("err %v (notes %v)", err, res.Notes)
	}
	switch {
	case res.Response == nil || res.Response.Text != answer:
		t.Fatalf("state %s response %+v notes %v", res.State, res.Response, res.Notes)
	case res.State == workflows.StateReconciled && res.Attempts[0].VerdictBy != attempt.ByJournal:
		t.Fatalf("reconciled by %q, not the journal: %v", res.Attempts[0].VerdictBy, res.Notes)
	case res.State != workflows.StateReconciled && res.State != workflows.StateCompleted:
		t.Fatalf("state %s notes %v", res.State, res.Notes)
	}
	if n := len(p.Received()); n != 1 {
		t.Fatalf("provider received %d requests; nothing may be sent again", n)
	}
	t.Logf("ended %s after the restart", res.State)
}

// entryID is the one journal entry's attempt id in dir, or "none" while
// there is none. An attempt has its end in <id>.json and its sent record
// in <id>.sent.
func entryID(t *testing.T, dir string) string {
	t.Helper()
	ids := map[string]bool{}
	for _, suffix := range []string{".json", ".sent"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*"+suffix))
		for _, f := range files {
			ids[strings.TrimSuffix(filepath.Base(f), suffix)] = true
		}
	}
	if len(ids) != 1 {
		return "none"
	}
	for id := range ids {
		return id
	}
	return "none"
}
