package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/testsuite/providertest"
)

// stuckJournal blocks for good (until the test ends) in every call it is
// asked to block in, ignoring its context, as a journal stuck in the
// kernel does (an NFS hard mount, a disk that stopped answering, an fsync
// that never returns): each such call holds an OS thread. It counts the
// calls that blocked. What it does not block, it passes to Dir.
type stuckJournal struct {
	journal.Dir
	hang                   chan struct{}
	blockWrite, blockReads bool
	blocked                atomic.Int32
}

func newStuckJournal(t *testing.T, writes, reads bool) *stuckJournal {
	j := &stuckJournal{Dir: journal.Dir{Path: t.TempDir()}, hang: make(chan struct{}), blockWrite: writes, blockReads: reads}
	t.Cleanup(func() { close(j.hang) })
	return j
}

func (j *stuckJournal) Record(ctx context.Context, e journal.Entry) error {
	if !j.blockWrite {
		return j.Dir.Record(ctx, e)
	}
	j.blocked.Add(1)
	<-j.hang
	return nil
}

func (j *stuckJournal) Lookup(ctx context.Context, id string) (journal.Entry, bool, error) {
	if !j.blockReads {
		return j.Dir.Lookup(ctx, id)
	}
	j.blocked.Add(1)
	<-j.hang
	return journal.Entry{}, false, nil
}

// A journal stuck in the kernel leaves every write the worker stopped
// waiting for blocked, an OS thread each. They are capped per worker,
// across attempts: past the cap a write is not started (a journal
// failure, counted), the count is in the metrics, and /readyz says so.
func TestAbandonedJournalWritesAreCappedPerWorker(t *testing.T) {
	a, _ := newActs(t)
	tel := withTelemetry(t, a)
	j := newStuckJournal(t, true, false)
	a.Journal, a.Logger = j, slog.New(slog.DiscardHandler)
	a.Abandoned = &AbandonedOps{Max: 3}
	const attempts = 12
	for i := range attempts {
		// The activity's deadline: the end record is abandoned 500 ms
		// before it.
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		in := attemptOn("openai", hello())
		in.AttemptID = fmt.Sprintf("act-%d", i)
		out, err := a.CallModel(ctx, in)
		cancel()
		if err != nil || out.Classification.Class != evidence.Completed {
			t.Fatalf("attempt %d: %+v %v", i, out.Classification, err)
		}
	}
	// Writes still in flight when the cap was reached (an attempt's sent
	// record and its end) may pass it; none after.
	if n := j.blocked.Load(); n > 3+2 {
		t.Fatalf("%d writes are blocked in the journal after %d attempts, with a cap of 3", n, attempts)
	}
	for give := time.Now().Add(10 * time.Second); a.Abandoned.Count() != int64(j.blocked.Load()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(give) {
			t.Fatalf("abandoned %d, blocked %d", a.Abandoned.Count(), j.blocked.Load())
		}
	}
	if err := a.Abandoned.Err(); !errors.Is(err, ErrJournalStuck) {
		t.Fatalf("at the cap: %v", err)
	}
	if got := metricLine(t, tel, "durallm_journal_abandoned"); !strings.HasSuffix(got, fmt.Sprintf(" %d", j.blocked.Load())) {
		t.Fatalf("abandoned metric %q, want %d", got, j.blocked.Load())
	}
	failures := metricLine(t, tel, "durallm_journal_failures_total")
	var n int
	if _, err := fmt.Sscanf(failures[strings.LastIndexByte(failures, ' ')+1:], "%d", &n); err != nil || n < attempts {
		t.Fatalf("journal failures %q: every attempt's end, written or skipped, is one", failures)
	}
}

// A journal read that hangs (a half-open PostgreSQL connection, a table
// lock, a stalled disk) is bounded: the built-in reconciler goes on to
// the provider's record, then to the application reconciler, instead of
// waiting on the journal until its own deadline, and the note says the
// journal did not answer.
func TestAHangingJournalReadMovesOnToTheNextSource(t *testing.T) {
	t.Run("the provider's record", func(t *testing.T) {
		a, p := newActs(t)
		withRecordRoute(a, p, time.Second)
		in := lostAnswer(t, a, p, providertest.Answer("the provider's own answer"))
		a.Journal, a.journalRead = newStuckJournal(t, false, true), 200*time.Millisecond
		out, err := reconcileWithin(t, a, in)
		if err != nil || out.Verdict != attempt.VerdictCompleted || out.By != attempt.ByProvider || out.Response == nil || out.Response.Text != "the provider's own answer" {
			t.Fatalf("out %+v err %v", out, err)
		}
		if out.JournalState != "unreadable" {
			t.Fatalf("journal state %q", out.JournalState)
		}
	})
	t.Run("the application reconciler", func(t *testing.T) {
		a, _ := newActs(t)
		a.Journal, a.journalRead = newStuckJournal(t, false, true), 200*time.Millisecond
		a.Reconciler = reconcilerFunc(func(context.Context, attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
			return attempt.ReconcileOutput{Note: "the usage ledger has nothing"}, nil
		})
		out, err := reconcileWithin(t, a, attempt.ReconcileInput{ActionRef: "act", Attempt: 1, AttemptID: "act-1-openai", Route: "openai"})
		if err != nil || out.By != attempt.ByReconciler || out.JournalState != "unreadable" {
			t.Fatalf("out %+v err %v", out, err)
		}
		if !strings.Contains(out.Note, "journal did not answer") || !strings.Contains(out.Note, "usage ledger") {
			t.Fatalf("the note does not say the journal timed out: %q", out.Note)
		}
	})
}

// reconcileWithin runs Reconcile with a minute of its own, as the
// workflow gives it, and fails the test if it is still running long after.
func reconcileWithin(t *testing.T, a *Activities, in attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		out attempt.ReconcileOutput
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := a.Reconcile(ctx, in)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(20 * time.Second):
		t.Fatal("the reconciler is still waiting on the journal")
	}
	return attempt.ReconcileOutput{}, nil
}

// A provider-record lookup that hangs is bounded too: three of them spend
// the lookups' budget, the application reconciler is asked next, and the
// note says the provider's record did not answer.
func TestAHangingProviderRecordLookupMovesOnAndSaysSo(t *testing.T) {
	a, p := newActs(t)
	withRecordRoute(a, p, 30*time.Second)
	in := lostAnswer(t, a, p, providertest.Answer("x"))
	a.recordLookup = 200 * time.Millisecond
	p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		if r.Method == http.MethodGet {
			return providertest.Hold(), true
		}
		return providertest.Behavior{}, false
	})
	a.Reconciler = reconcilerFunc(func(context.Context, attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
		return attempt.ReconcileOutput{Note: "the usage ledger has nothing"}, nil
	})
	out, err := reconcileWithin(t, a, in)
	if err != nil || out.By != attempt.ByReconciler || out.ProviderRecord != attempt.ProviderRecordUnreadable {
		t.Fatalf("out %+v err %v", out, err)
	}
	if !strings.Contains(out.Note, "did not answer within 200ms") || !strings.Contains(out.Note, "usage ledger") {
		t.Fatalf("the note does not say the provider's record timed out: %q", out.Note)
	}
}
