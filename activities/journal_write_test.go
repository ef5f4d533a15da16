package activities

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
)

// hangingJournal's writes hang until the test ends, as a journal behind
// a PostgreSQL failover that left connections half-open, or an NFS stall,
// does: they neither fail nor finish. Lookups find nothing.
type hangingJournal struct{ hang chan struct{} }

func (h hangingJournal) Record(context.Context, journal.Entry) error { <-h.hang; return nil }
func (h hangingJournal) Lookup(context.Context, string) (journal.Entry, bool, error) {
	return journal.Entry{}, false, nil
}

// hangingStore's Put hangs the same way.
type hangingStore struct{ hang chan struct{} }

func (h hangingStore) Put(context.Context, []byte) (string, error) { <-h.hang; return "", nil }
func (h hangingStore) Get(context.Context, string) ([]byte, error) {
	return nil, resultstore.ErrNotFound
}

func journalFailures(t *testing.T, tel *telemetry.Telemetry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, "durallm_journal_failures_total") {
			return line
		}
	}
	return ""
}

// A journal (or result store) that hangs instead of failing never keeps
// an answer the worker holds from being reported before the activity's
// deadline: every write is bounded well inside it, one that runs out is
// a journal failure, and the outcome is reported all the same.
func TestAHangingJournalNeverHoldsBackTheReport(t *testing.T) {
	a, p := newActs(t)
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	var logs syncbuf.Buffer
	a.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	tel, err := telemetry.New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	a.Telemetry, a.Journal, a.Results, a.LargeResponseBytes = tel, hangingJournal{hang}, hangingStore{hang}, 1024
	a.lease = 50 * time.Millisecond
	answer := strings.Repeat("the whole answer ", 200)
	release := make(chan struct{})
	p.Push(providertest.Answer(answer).WaitFor(release))
	time.AfterFunc(300*time.Millisecond, func() { close(release) }) // renewals hang meanwhile
	// The activity's deadline (StartToClose), as Temporal sets it.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	type result struct {
		out      attempt.Outcome
		err      error
		inTime   bool
		returned time.Time
	}
	done := make(chan result, 1)
	go func() {
		out, err := a.CallModel(ctx, attemptOn("openai", hello()))
		done <- result{out: out, err: err, inTime: ctx.Err() == nil}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("CallModel is still waiting for the journal long after the activity's deadline")
	}
	if !r.inTime {
		t.Fatal("CallModel returned after the activity's deadline: the SDK would drop (and log) the result")
	}
	if r.err != nil || r.out.Classification.Class != evidence.Completed || r.out.Response == nil || r.out.Response.Text != answer {
		t.Fatalf("outcome %+v err %v", r.out.Classification, r.err)
	}
	if got := journalFailures(t, tel); !strings.HasSuffix(got, " 2") {
		t.Fatalf("journal failures (a sent record and the end): %q", got)
	}
	if !strings.Contains(logs.String(), "attempt journal unavailable") || !strings.Contains(logs.String(), "result store failed") {
		t.Fatalf("the hanging writes were not reported:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "whole answer") {
		t.Fatal("the log holds the answer")
	}
}

// stuckFirstSent is a Dir whose first Sent write sticks until released.
type stuckFirstSent struct {
	journal.Dir
	once    sync.Once
	stuck   chan struct{}
	release chan struct{}
	landed  chan struct{}
}

func (s *stuckFirstSent) Record(ctx context.Context, e journal.Entry) error {
	first := false
	if e.State == journal.Sent {
		s.once.Do(func() { first = true })
	}
	if !first {
		return s.Dir.Record(ctx, e)
	}
	close(s.stuck)
	<-s.release
	defer close(s.landed)
	return s.Dir.Record(ctx, e)
}

// A renewal does not wait for the write before it: while one is stuck the
// next goes out on time, so a live worker is not taken for dead. The stuck
// one landing after the end does not hide it.
func TestARenewalGoesOutOnTimeWhileAnEarlierWriteIsStuck(t *testing.T) {
	a, p := newActs(t)
	j := &stuckFirstSent{Dir: journal.Dir{Path: t.TempDir()}, stuck: make(chan struct{}), release: make(chan struct{}), landed: make(chan struct{})}
	a.Journal, a.lease, a.Logger = j, 100*time.Millisecond, slog.New(slog.DiscardHandler)
	answer := make(chan struct{})
	p.Push(providertest.Answer("in the end").WaitFor(answer))
	in := attemptOn("openai", hello())
	done := callInBackground(context.Background(), a, in)
	<-j.stuck
	renewed := false
	for give := time.Now().Add(5 * time.Second); !renewed && time.Now().Before(give); time.Sleep(20 * time.Millisecond) {
		e, ok, err := j.Lookup(context.Background(), in.AttemptID)
		renewed = err == nil && ok && e.State == journal.Sent
	}
	if !renewed {
		close(j.release)
		close(answer)
		t.Fatal("no renewal went out while the first sent record was stuck")
	}
	close(answer)
	out := <-done
	close(j.release)
	if out.Classification.Class != evidence.Completed {
		t.Fatalf("classified %s", out.Classification.Class)
	}
	<-j.landed // the stuck write, after the end
	if e, _, _ := j.Lookup(context.Background(), in.AttemptID); e.State != journal.Received || e.Response == nil || e.Response.Text != "in the end" {
		t.Fatalf("entry after the end: %+v", e)
	}
}
