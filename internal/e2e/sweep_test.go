package e2e_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	durallm "github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// The sweep tests share one PostgreSQL and one embedded Temporal server,
// started by the first of them and stopped when the package's tests end
// (TestMain).
var sweep struct {
	once sync.Once
	err  error
	pg   *pgserver.Server
	srv  *devserver.Server
	tc   client.Client
	dir  string
}

// sweepServers starts them, once.
func sweepServers(t *testing.T) (*pgserver.Server, client.Client) {
	t.Helper()
	sweep.once.Do(func() {
		if sweep.pg, sweep.err = pgserver.Start(context.Background(), pgserver.Options{}); sweep.err != nil {
			return
		}
		if sweep.dir, sweep.err = os.MkdirTemp("", "durallm-sweep-"); sweep.err != nil {
			return
		}
		if sweep.srv, sweep.err = devserver.Start(context.Background(), devserver.Options{DataDir: sweep.dir, FrontendPort: devserver.FreePort, DisableUI: true,
			SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler)}); sweep.err != nil {
			return
		}
		sweep.tc, sweep.err = client.Dial(client.Options{HostPort: sweep.srv.FrontendHostPort(), Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	})
	if sweep.err != nil {
		t.Fatal(sweep.err)
	}
	return sweep.pg, sweep.tc
}

// stopSweepServers stops what sweepServers started.
func stopSweepServers() {
	if sweep.tc != nil {
		sweep.tc.Close()
	}
	if sweep.srv != nil {
		_ = sweep.srv.Stop()
	}
	if sweep.dir != "" {
		os.RemoveAll(sweep.dir)
	}
	if sweep.pg != nil {
		_ = sweep.pg.Stop()
	}
}

// hold is an action that runs until it is signalled "release".
func hold(ctx workflow.Context) error {
	workflow.GetSignalChannel(ctx, "release").Receive(ctx, nil)
	return nil
}

// untilGone waits for the sweeper's rounds to remove what, with no bound
// on how fast: it fails only if what is still there a minute on.
func untilGone(t *testing.T, what string, present func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		there, err := present()
		if err != nil {
			t.Fatal(err)
		}
		if !there {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there a minute after its action closed", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func backends(pg *pgserver.Server) map[string]func(t *testing.T) journal.Expirable {
	return map[string]func(t *testing.T) journal.Expirable{
		"dir": func(t *testing.T) journal.Expirable { return journal.Dir{Path: filepath.Join(t.TempDir(), "journal")} },
		"postgres": func(t *testing.T) journal.Expirable {
			j, err := journal.OpenPostgres(context.Background(), pg.FreshDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(j.Close)
			return j
		},
	}
}

// Entries expire Retention after their action closed; entries of a
// running action are kept however old; entries of an action Temporal no
// longer knows are past its retention and go.
func TestSweepExpiresOnlyEntriesOfActionsClosedLongerThanTheRetention(t *testing.T) {
	pg, tc := sweepServers(t)
	ctx := context.Background()
	queue := "hold-" + t.Name()
	w := sdkworker.New(tc, queue, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(hold, workflow.RegisterOptions{Name: "hold"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	start := func(id string) client.WorkflowRun {
		run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue}, "hold")
		if err != nil {
			t.Fatal(err)
		}
		return run
	}
	closed, running := start("closed-action"), start("running-action")
	if err := tc.SignalWorkflow(ctx, closed.GetID(), "", "release", nil); err != nil {
		t.Fatal(err)
	}
	if err := closed.Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	defer tc.TerminateWorkflow(ctx, running.GetID(), "", "test over")

	for name, open := range backends(pg) {
		t.Run(name, func(t *testing.T) {
			j := open(t)
			for _, e := range []journal.Entry{
				{AttemptID: "c-1", ActionRef: "closed-action", State: journal.EndedUnanswered},
				{AttemptID: "c-2", ActionRef: "closed-action", State: journal.Received, Response: &providers.Response{Text: "x"}},
				{AttemptID: "r-1", ActionRef: "running-action", State: journal.Sent},
				{AttemptID: "g-1", ActionRef: "action-temporal-never-knew", State: journal.Received},
			} {
				if err := j.Record(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			s := &journal.Sweeper{Journal: j, Actions: worker.TemporalActions(tc)}
			// Now: every entry is younger than the retention.
			if r, err := s.Sweep(ctx, time.Now()); err != nil || r.Deleted != 0 {
				t.Fatalf("sweep now: %+v %v", r, err)
			}
			// Eight days on, the closed action has been closed longer than
			// the seven days' retention.
			r, err := s.Sweep(ctx, time.Now().Add(8*24*time.Hour))
			if err != nil || r.Deleted != 3 || r.Kept != 1 {
				t.Fatalf("sweep in eight days: %+v %v", r, err)
			}
			for id, want := range map[string]bool{"c-1": false, "c-2": false, "g-1": false, "r-1": true} {
				if _, ok, err := j.Lookup(ctx, id); err != nil || ok != want {
					t.Errorf("%s: kept %v, want %v (%v)", id, ok, want, err)
				}
			}
			// A retention longer than the action has been closed keeps it.
			if err := j.Record(ctx, journal.Entry{AttemptID: "c-3", ActionRef: "closed-action", State: journal.EndedUnanswered}); err != nil {
				t.Fatal(err)
			}
			long := &journal.Sweeper{Journal: j, Actions: worker.TemporalActions(tc), Retention: 30 * 24 * time.Hour}
			if r, err := long.Sweep(ctx, time.Now().Add(8*24*time.Hour)); err != nil || r.Deleted != 0 {
				t.Fatalf("30 days' retention: %+v %v", r, err)
			}
		})
	}
}

// startSweepingWorker starts a durallm worker on o's task queue, with one
// route to p, that sweeps every 100 ms; o says what it keeps and for how
// long.
func startSweepingWorker(t *testing.T, tc client.Client, p *providertest.Provider, o worker.Options) *worker.Worker {
	t.Helper()
	o.TLS, o.SearchAttributes, o.Logger = p.ClientTLSConfig(), true, slog.New(slog.DiscardHandler)
	o.Config = routes.Config{Routes: []routes.Route{{Name: "r", Kind: routes.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m"}}}
	o.JournalSweepEvery = 100 * time.Millisecond
	w, err := worker.New(tc, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	return w
}

// runHello runs a one-message action id on route r and waits for it.
func runHello(ctx context.Context, c *durallm.Client, id string) (workflows.ActionResult, error) {
	a, err := c.Start(ctx, id, workflows.ActionInput{Routes: []string{"r"},
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hello")}}})
	if err != nil {
		return workflows.ActionResult{}, err
	}
	return a.Result(ctx)
}

// A durallm worker sweeps its journal by itself: the entry of an action
// that ended goes once the (here, tiny) retention has passed.
func TestTheWorkerSweepsItsJournal(t *testing.T) {
	pg, tc := sweepServers(t)
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for name, open := range backends(pg) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			j := open(t)
			queue := "sweep-" + name
			newWorker := func(retention time.Duration) *worker.Worker {
				return startSweepingWorker(t, tc, p, worker.Options{TaskQueue: queue, Journal: j, JournalRetention: retention})
			}
			// The first worker does not sweep (negative retention).
			w := newWorker(-1)
			res, err := runHello(ctx, durallm.NewClient(tc, queue), "swept-"+name)
			if err != nil {
				t.Fatal(err)
			}
			w.Stop()
			attemptID := res.Attempts[0].Evidence.AttemptID
			if e, ok, err := j.Lookup(ctx, attemptID); err != nil || !ok || e.ActionRef != "swept-"+name {
				t.Fatalf("the attempt's entry: %+v %v %v", e, ok, err)
			}
			// A worker that sweeps, with a tiny retention, removes it.
			defer newWorker(time.Nanosecond).Stop()
			untilGone(t, "entry "+attemptID, func() (bool, error) {
				_, ok, err := j.Lookup(ctx, attemptID)
				return ok, err
			})
		})
	}
}
