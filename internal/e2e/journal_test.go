package e2e_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// The journal unreachable: the action still completes on the embedded
// server, the journal's absence is reported (a warning per attempt; the
// telemetry counter beside it), and the worker never crashes.
func TestE2EJournalUnreachableTheActionStillCompletes(t *testing.T) {
	s := newStack(t)
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	s.startWorker(func(o *worker.Options) {
		o.Journal = journal.Dir{Path: filepath.Join(file, "journal")}
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	s.p.Push(providertest.Answer("answered without a journal"))
	res, err := s.run("no-journal", actionInput(false))
	if err != nil || res.State != workflows.StateCompleted || res.Response == nil || res.Response.Text != "answered without a journal" {
		t.Fatalf("state %s err %v response %+v", res.State, err, res.Response)
	}
	if out := logs.String(); !strings.Contains(out, "attempt journal unavailable") {
		t.Fatalf("the journal's absence was not reported; worker log:\n%s", out)
	}
}

// hangingJournal's writes hang until the test ends (a PostgreSQL failover
// that left connections half-open, an NFS stall): they neither fail nor
// finish. Lookups find nothing.
type hangingJournal struct{ hang chan struct{} }

func (h hangingJournal) Record(context.Context, journal.Entry) error { <-h.hang; return nil }
func (h hangingJournal) Lookup(context.Context, string) (journal.Entry, bool, error) {
	return journal.Entry{}, false, nil
}

// A journal that hangs for longer than the attempt's deadline keeps
// nothing from the action: it completes with the worker's answer, the
// journal failure is counted, and no log line, the Temporal SDK's
// included, holds the prompt or the answer.
func TestE2EAJournalThatHangsPastTheDeadlineHoldsNoAnswerBack(t *testing.T) {
	const prompt, answer = "PROMPT-CANARY-9931", "ANSWER-CANARY-1277"
	s := newStack(t)
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s.tc = s.ts.NewClientWithOptions(client.Options{Logger: telemetry.TemporalLogger(logger)})
	s.c = durallm.NewClient(s.tc, s.tq)
	tel, err := telemetry.New(logger)
	if err != nil {
		t.Fatal(err)
	}
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	w := s.startWorker(func(o *worker.Options) {
		o.Journal, o.Logger, o.Telemetry, o.MetricsAddr = hangingJournal{hang}, logger, tel, "127.0.0.1:0"
	})
	in := actionInput(true)
	in.Request.Messages = []providers.Message{providers.TextMessage("user", prompt)}
	// Past the first renewal of the sent record, which hangs too.
	s.p.Push(providertest.Answer(answer).After(300 * time.Millisecond))
	res, err := s.run("hanging-journal", in)
	if err != nil || res.State != workflows.StateCompleted || res.Response == nil || res.Response.Text != answer || len(res.Attempts) != 1 {
		t.Fatalf("state %s err %v attempts %d", res.State, err, len(res.Attempts))
	}
	metrics, err := providertest.Scrape("http://" + w.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, "durallm_journal_failures_total") || strings.Contains(metrics, "durallm_journal_failures_total 0") {
		t.Fatalf("the journal failure was not counted:\n%s", metrics)
	}
	out := logs.String()
	if !strings.Contains(out, "attempt journal unavailable") {
		t.Fatalf("the hanging journal was not reported:\n%s", out)
	}
	for _, canary := range []string{prompt, answer} {
		if strings.Contains(out, canary) {
			t.Errorf("the log holds %q", canary)
		}
	}
}

// Whatever the timing, the Temporal SDK's own line for an activity that
// returns after its deadline keeps its result out of the log: through a
// real worker on the embedded server, an activity that returns its
// answer late.
func TestE2ETheSDKNeverLogsTheResultOfAnActivityThatReturnedLate(t *testing.T) {
	const answer = "ANSWER-CANARY-4545"
	s := newStack(t)
	var logs syncbuf.Buffer
	// The text handler prints the result's payloads as proto text, the
	// answer readable in it (what durallm's commands log with).
	tc := s.ts.NewClientWithOptions(client.Options{Logger: telemetry.TemporalLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))})
	w := sdkworker.New(tc, s.tq, sdkworker.Options{})
	w.RegisterActivityWithOptions(func(ctx context.Context) (string, error) {
		<-ctx.Done() // past its deadline
		return "the answer is " + answer, nil
	}, activity.RegisterOptions{Name: "late"})
	w.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Second, RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}})
		return workflow.ExecuteActivity(ctx, "late").Get(ctx, nil)
	}, workflow.RegisterOptions{Name: "late-workflow"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: s.tq}, "late-workflow")
	if err != nil {
		t.Fatal(err)
	}
	_ = run.Get(ctx, nil) // the activity timed out
	for !strings.Contains(logs.String(), "Activity complete after timeout.") {
		if ctx.Err() != nil {
			t.Fatalf("the SDK never logged the late activity:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(logs.String(), answer) {
		t.Fatalf("the SDK logged the late activity's result:\n%s", logs.String())
	}
}
