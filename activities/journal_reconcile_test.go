package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/providertest"
)

// Only the causes that mean "stop" end the exchange; the SDK's own
// cancellation of an attempt Temporal lost track of does not.
func TestTemporalLostCauses(t *testing.T) {
	for _, tt := range []struct {
		name  string
		cause error
		lost  bool
	}{
		{"no cause", nil, false},
		{"bare cancel", context.Canceled, false},
		{"deadline", context.DeadlineExceeded, false},
		{"the workflow asked", temporal.NewCanceledError(), false},
		{"the workflow asked, wrapped", fmt.Errorf("x: %w", temporal.NewCanceledError("details")), false},
		{"our worker stopping", ErrWorkerStopping, false},
		{"the SDK's worker shutdown", worker.ErrWorkerShutdown, false},
		{"paused", activity.ErrActivityPaused, false},
		{"reset", activity.ErrActivityReset, false},
		{"activity gone on the server", serviceerror.NewNotFound("workflow execution already completed"), true},
		{"server unreachable for the heartbeat timeout", serviceerror.NewUnavailable("connection refused"), true},
	} {
		if got := temporalLost(tt.cause); got != tt.lost {
			t.Errorf("%s: temporalLost = %v, want %v", tt.name, got, tt.lost)
		}
	}
}

func TestOutliveLostAttempt(t *testing.T) {
	a, _ := newActs(t)
	for _, tt := range []struct {
		cause     error
		onTheWire bool
		stopped   bool
		with      error // the exchange's cause, when stopped
	}{
		{temporal.NewCanceledError(), true, true, nil},
		{serviceerror.NewNotFound("gone"), true, false, nil},
		{serviceerror.NewNotFound("gone"), false, true, ErrTemporalLost},
		{serviceerror.NewUnavailable("down"), false, true, ErrTemporalLost},
	} {
		parent, cancel := context.WithCancelCause(context.Background())
		exch, done := a.outliveLostAttempt(parent, attempt.Input{AttemptID: "a-1"}, func() bool { return tt.onTheWire })
		cancel(tt.cause)
		select {
		case <-exch.Done():
			if !tt.stopped {
				t.Errorf("%v (on the wire %v): the exchange was cut", tt.cause, tt.onTheWire)
			} else if !errors.Is(context.Cause(exch), tt.cause) || (tt.with != nil && !errors.Is(context.Cause(exch), tt.with)) {
				t.Errorf("%v (on the wire %v): exchange cause %v", tt.cause, tt.onTheWire, context.Cause(exch))
			}
		case <-time.After(200 * time.Millisecond):
			if tt.stopped {
				t.Errorf("%v (on the wire %v): the exchange was not stopped", tt.cause, tt.onTheWire)
			}
		}
		done()
		if exch.Err() == nil {
			t.Errorf("%v: the exchange context outlived its attempt", tt.cause)
		}
	}
	// The exchange keeps the activity's deadline.
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	exch, done := a.outliveLostAttempt(parent, attempt.Input{}, func() bool { return true })
	defer done()
	want, _ := parent.Deadline()
	if got, ok := exch.Deadline(); !ok || !got.Equal(want) {
		t.Fatalf("deadline %v %v, want %v", got, ok, want)
	}
}

// An attempt the engine proved was not processed is journaled as such,
// and the built-in reconciler sends the action on: not executed, by the
// journal.
func TestCallModelJournalsRefusedAndTheReconcilerSaysNotExecuted(t *testing.T) {
	a, p := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	p.Push(providertest.RefuseStream())
	in := attemptOn("openai", hello())
	if out, _ := a.CallModel(context.Background(), in); out.Classification.Class != evidence.Refused {
		t.Fatalf("classified %s/%s", out.Classification.Class, out.Classification.Reason)
	}
	e, ok, err := a.Journal.Lookup(context.Background(), in.AttemptID)
	if err != nil || !ok || e.State != journal.NotProcessed || e.Class != evidence.Refused {
		t.Fatalf("entry %+v ok %v err %v", e, ok, err)
	}
	v, err := a.Reconcile(context.Background(), attempt.ReconcileInput{AttemptID: in.AttemptID})
	if err != nil || v.Verdict != attempt.VerdictNotExecuted || v.By != attempt.ByJournal {
		t.Fatalf("verdict %+v err %v", v, err)
	}
}

func TestReconcileNotProcessedIsNotExecuted(t *testing.T) {
	a, _ := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	ctx := context.Background()
	if err := a.Journal.Record(ctx, journal.Entry{AttemptID: "run-1", State: journal.NotProcessed, Class: evidence.Unsent, Reason: "goaway_above_last_stream"}); err != nil {
		t.Fatal(err)
	}
	v, err := a.Reconcile(ctx, attempt.ReconcileInput{AttemptID: "run-1"})
	if err != nil || v.Verdict != attempt.VerdictNotExecuted || v.By != attempt.ByJournal || !strings.Contains(v.Note, "goaway_above_last_stream") {
		t.Fatalf("verdict %+v err %v", v, err)
	}
}

// A request journaled as sent may still end on a live worker: the
// reconciler waits for its end, and takes the answer when it comes.
func TestReconcileWaitsForASentAttemptToEndOnItsWorker(t *testing.T) {
	a, _ := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	ctx := context.Background()
	if err := a.Journal.Record(ctx, journal.Entry{AttemptID: "run-1", State: journal.Sent, At: time.Now(), Remaining: time.Minute}); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		time.Sleep(3 * journalPoll)
		ended <- a.Journal.Record(ctx, journal.Entry{AttemptID: "run-1", State: journal.Received, Response: &providers.Response{Text: "late but whole"}})
	}()
	v, err := a.Reconcile(ctx, attempt.ReconcileInput{AttemptID: "run-1"})
	if rerr := <-ended; rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil || v.Verdict != attempt.VerdictCompleted || v.Response == nil || v.Response.Text != "late but whole" {
		t.Fatalf("verdict %+v err %v", v, err)
	}
}

// The wait is bounded by the attempt's own deadline (and the activity's):
// past it, the journal says what it knew and the action goes on to a
// person.
func TestReconcileStopsWaitingAtTheAttemptsDeadline(t *testing.T) {
	a, _ := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	ctx := context.Background()
	// An entry from before Remaining: its deadline is its Deadline minus
	// its At, both on the writer's clock.
	at := time.Now().Add(-time.Hour)
	if err := a.Journal.Record(ctx, journal.Entry{AttemptID: "run-1", State: journal.Sent, At: at, Deadline: at.Add(-journalEndGrace)}); err != nil {
		t.Fatal(err)
	}
	v, err := a.Reconcile(ctx, attempt.ReconcileInput{AttemptID: "run-1"})
	if err != nil || v.Verdict != attempt.VerdictNone || !strings.Contains(v.Note, "deadline passed") {
		t.Fatalf("verdict %+v err %v", v, err)
	}
	// The activity's own deadline bounds the wait too.
	if err := a.Journal.Record(ctx, journal.Entry{AttemptID: "run-2", State: journal.Sent, At: time.Now(), Remaining: time.Hour}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if v, err := a.Reconcile(short, attempt.ReconcileInput{AttemptID: "run-2"}); err != nil || v.Verdict != attempt.VerdictNone || !strings.Contains(v.Note, "own time ran out") {
		t.Fatalf("verdict %+v err %v", v, err)
	}
}

// A live worker renews its Sent record while the exchange runs, and its
// end replaces it.
func TestCallModelRenewsItsSentRecordWhileTheExchangeRuns(t *testing.T) {
	a, p := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	a.lease = 100 * time.Millisecond
	release := make(chan struct{})
	p.Push(providertest.Answer("in the end").WaitFor(release))
	in := attemptOn("openai", hello())
	done := callInBackground(context.Background(), a, in)
	seen := map[time.Time]bool{}
	for give := time.Now().Add(20 * time.Second); len(seen) < 3; {
		if time.Now().After(give) {
			t.Fatalf("saw %d distinct sent records in 20s", len(seen))
		}
		if e, ok, err := a.Journal.Lookup(context.Background(), in.AttemptID); err == nil && ok {
			if e.State != journal.Sent {
				t.Fatalf("entry while the exchange runs: %+v", e)
			}
			seen[e.At] = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	if out := <-done; out.Classification.Class != evidence.Completed {
		t.Fatalf("classified %s", out.Classification.Class)
	}
	if e, _, _ := a.Journal.Lookup(context.Background(), in.AttemptID); e.State != journal.Received || e.Response == nil || e.Response.Text != "in the end" {
		t.Fatalf("entry after the end: %+v", e)
	}
}

// A Sent entry nobody renews is a dead worker's: the reconciler does not
// wait for its deadline.
func TestReconcileDoesNotWaitForASentEntryNobodyRenews(t *testing.T) {
	a, _ := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	a.lease = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Journal.Record(ctx, journal.Entry{AttemptID: "run-1", State: journal.Sent, At: time.Now(), Deadline: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	v, err := a.Reconcile(ctx, attempt.ReconcileInput{AttemptID: "run-1"})
	if err != nil || v.Verdict != attempt.VerdictNone || v.JournalState != "sent" || !strings.Contains(v.Note, "stopped renewing") {
		t.Fatalf("verdict %+v err %v", v, err)
	}
}

// A reconciler cut short while it waits (its worker stops, or it is
// canceled) has not found that the journal cannot tell: it returns an
// error wrapping the cause, so Temporal retries it on another worker
// (the workflow schedules it with MaximumAttempts 3).
func TestAReconcilerCutShortByItsWorkersStopIsRetried(t *testing.T) {
	for _, cause := range []error{worker.ErrWorkerShutdown, temporal.NewCanceledError()} {
		a, _ := newActs(t)
		a.Journal = journal.Dir{Path: t.TempDir()}
		bg := context.Background()
		if err := a.Journal.Record(bg, journal.Entry{AttemptID: "run-1", State: journal.Sent, At: time.Now(), Deadline: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancelCause(bg)
		time.AfterFunc(2*journalPoll, func() { stop(cause) })
		v, err := a.Reconcile(ctx, attempt.ReconcileInput{AttemptID: "run-1"})
		if !errors.Is(err, cause) || !errors.Is(err, context.Canceled) {
			t.Errorf("%v: verdict %+v err %v", cause, v, err)
		}
	}
}

// A Sent entry is judged on this reader's own observation of it, never by
// comparing the writer's clock with the reader's: a live worker whose
// clock is an hour behind is waited for, and while it renews, the note
// never says it stopped renewing.
func TestReconcileJudgesASentEntryOnItsOwnClock(t *testing.T) {
	a, _ := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	a.lease = 100 * time.Millisecond
	bg := context.Background()
	// The writer's clock, an hour behind the reader's; its attempt has a
	// minute left.
	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	deadline := behind().Add(time.Minute)
	sent := func(id string) journal.Entry {
		at := behind()
		return journal.Entry{AttemptID: id, State: journal.Sent, At: at, Deadline: deadline, Remaining: deadline.Sub(at)}
	}
	renew := func(id string, stop <-chan struct{}, done chan<- struct{}) {
		defer close(done)
		for {
			if err := a.Journal.Record(bg, sent(id)); err != nil {
				t.Error(err)
			}
			select {
			case <-stop:
				return
			case <-time.After(a.lease):
			}
		}
	}

	// It renews, then ends with an answer: the reader waits for it.
	stop := make(chan struct{})
	if err := a.Journal.Record(bg, sent("run-1")); err != nil {
		t.Fatal(err)
	}
	renewed := make(chan struct{})
	go renew("run-1", stop, renewed)
	time.AfterFunc(6*journalPoll, func() {
		close(stop)
		<-renewed // its worker stops renewing before it writes the end
		if err := a.Journal.Record(bg, journal.Entry{AttemptID: "run-1", State: journal.Received, Response: &providers.Response{Text: "late but whole"}}); err != nil {
			t.Error(err)
		}
	})
	v, err := a.Reconcile(bg, attempt.ReconcileInput{AttemptID: "run-1"})
	if err != nil || v.Verdict != attempt.VerdictCompleted || v.Response == nil || v.Response.Text != "late but whole" {
		t.Fatalf("a live worker whose clock is behind: verdict %+v err %v", v, err)
	}

	// It renews and has not ended when this reconciler's own time runs
	// out: the note says so, not that the worker stopped renewing.
	stop, renewed = make(chan struct{}), make(chan struct{})
	defer func() { close(stop); <-renewed }()
	if err := a.Journal.Record(bg, sent("run-2")); err != nil {
		t.Fatal(err)
	}
	go renew("run-2", stop, renewed)
	short, cancel := context.WithTimeout(bg, 1500*time.Millisecond)
	defer cancel()
	v, err = a.Reconcile(short, attempt.ReconcileInput{AttemptID: "run-2"})
	if err != nil || v.Verdict != attempt.VerdictNone || v.JournalState != "sent" || strings.Contains(v.Note, "stopped renewing") || !strings.Contains(v.Note, "still renews") {
		t.Fatalf("a live worker still renewing: verdict %+v err %v", v, err)
	}
}

// slowRenewals is a Dir whose Sent writes after the first take 2.7 s each
// (a journal that slowed down under load), whatever their context says.
type slowRenewals struct {
	journal.Dir
	sent atomic.Int32
}

func (s *slowRenewals) Record(ctx context.Context, e journal.Entry) error {
	if e.State == journal.Sent && s.sent.Add(1) > 1 {
		time.Sleep(2700 * time.Millisecond)
	}
	return s.Dir.Record(ctx, e)
}

// A live worker whose renewal writes slow down to 2.7 s, with a 1 s
// lease, lands each one inside the bound it gives it (three leases), so
// the reader's patience covers that bound: the reconciler waits for the
// end and settles the attempt from it, instead of deciding after 3 s
// that the worker stopped renewing.
func TestALiveWorkerWhoseRenewalsSlowDownIsNotTakenForDead(t *testing.T) {
	writer, p := newActs(t)
	j := &slowRenewals{Dir: journal.Dir{Path: t.TempDir()}}
	writer.Journal, writer.lease = j, time.Second
	release := make(chan struct{})
	p.Push(providertest.Answer("the whole answer").WaitFor(release))
	time.AfterFunc(6*time.Second, func() { close(release) })
	in := attemptOn("openai", hello())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := callInBackground(ctx, writer, in)
	for give := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok, _ := j.Lookup(ctx, in.AttemptID); ok {
			break
		}
		if time.Now().After(give) {
			t.Fatal("no sent record")
		}
	}
	// Another worker's reconciler, as when Temporal lost track of the
	// attempt while its worker runs on.
	reader, _ := newActs(t)
	reader.Journal, reader.lease = j.Dir, time.Second
	v, err := reader.Reconcile(ctx, attempt.ReconcileInput{ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID, Route: in.Route})
	if out := <-done; out.Classification.Class != evidence.Completed {
		t.Fatalf("the attempt: %s", out.Classification.Class)
	}
	if err != nil || v.Verdict != attempt.VerdictCompleted || v.By != attempt.ByJournal || v.Response == nil || v.Response.Text != "the whole answer" {
		t.Fatalf("verdict %+v err %v", v, err)
	}
}
