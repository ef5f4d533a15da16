// Package journaltest is the behaviour every attempt journal backend
// promises (journal.Journal), as one test suite each backend runs against
// a real instance of itself.
package journaltest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
)

// Run runs the suite. open returns an empty journal for one subtest.
func Run(t *testing.T, open func(t *testing.T) journal.Journal) {
	t.Run("RecordsAndLooksUp", func(t *testing.T) { recordsAndLooksUp(t, open(t)) })
	t.Run("SentNeverHidesTheEnd", func(t *testing.T) { sentNeverHidesTheEnd(t, open(t)) })
	t.Run("RefusesIDsThatAreNotKeys", func(t *testing.T) { refusesBadIDs(t, open(t)) })
	t.Run("ReadersSeeWholeEntries", func(t *testing.T) { readersSeeWholeEntries(t, open(t)) })
}

func recordsAndLooksUp(t *testing.T, j journal.Journal) {
	ctx := context.Background()
	if _, ok, err := j.Lookup(ctx, "run-1"); ok || err != nil {
		t.Fatalf("empty journal: ok %v err %v", ok, err)
	}
	e := journal.Entry{AttemptID: "run-1", ActionRef: "a", Attempt: 1, State: journal.Received, Class: recovery.Completed,
		Response: &providers.Response{Text: "the answer"}, At: time.Unix(1, 0).UTC()}
	if err := j.Record(ctx, e); err != nil {
		t.Fatal(err)
	}
	got, ok, err := j.Lookup(ctx, "run-1")
	if err != nil || !ok || got.State != journal.Received || got.Response == nil || got.Response.Text != "the answer" ||
		!got.At.Equal(e.At) || got.ActionRef != "a" || got.Attempt != 1 || got.Class != recovery.Completed {
		t.Fatalf("lookup: %+v ok %v err %v", got, ok, err)
	}
	// A later end replaces the earlier one.
	e.State, e.Response, e.Reason = journal.EndedUnanswered, nil, "no_response"
	if err := j.Record(ctx, e); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := j.Lookup(ctx, "run-1"); got.State != journal.EndedUnanswered || got.Response != nil || got.Reason != "no_response" {
		t.Fatalf("replaced: %+v", got)
	}
}

// Sent replaces only Sent: written late (it is written while the
// exchange runs), it must not hide a received response.
func sentNeverHidesTheEnd(t *testing.T, j journal.Journal) {
	ctx := context.Background()
	deadline := time.Unix(100, 0).UTC()
	if err := j.Record(ctx, journal.Entry{AttemptID: "s-1", State: journal.Sent, Deadline: deadline}); err != nil {
		t.Fatal(err)
	}
	if got, ok, _ := j.Lookup(ctx, "s-1"); !ok || got.State != journal.Sent || !got.Deadline.Equal(deadline) {
		t.Fatalf("sent: %+v ok %v", got, ok)
	}
	// Its worker renews it while the exchange runs.
	renewed := time.Unix(50, 0).UTC()
	if err := j.Record(ctx, journal.Entry{AttemptID: "s-1", State: journal.Sent, At: renewed, Deadline: deadline}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := j.Lookup(ctx, "s-1"); got.State != journal.Sent || !got.At.Equal(renewed) {
		t.Fatalf("renewed: %+v", got)
	}
	if err := j.Record(ctx, journal.Entry{AttemptID: "s-1", State: journal.Received, Response: &providers.Response{Text: "x"}}); err != nil {
		t.Fatal(err)
	}
	if err := j.Record(ctx, journal.Entry{AttemptID: "s-1", State: journal.Sent}); err != nil {
		t.Fatalf("a late Sent is not an error: %v", err)
	}
	if got, _, _ := j.Lookup(ctx, "s-1"); got.State != journal.Received || got.Response == nil {
		t.Fatalf("a late Sent replaced the end: %+v", got)
	}
}

func refusesBadIDs(t *testing.T, j journal.Journal) {
	for _, id := range []string{"", "../escape", "a/b", ".hidden", strings.Repeat("x", 201), "a b"} {
		if err := j.Record(context.Background(), journal.Entry{AttemptID: id, State: journal.Received}); !errors.Is(err, journal.ErrBadAttemptID) {
			t.Errorf("Record(%q): %v", id, err)
		}
		if _, _, err := j.Lookup(context.Background(), id); !errors.Is(err, journal.ErrBadAttemptID) {
			t.Errorf("Lookup(%q): %v", id, err)
		}
	}
}

// Readers never see half an entry while writers replace it.
func readersSeeWholeEntries(t *testing.T, j journal.Journal) {
	ctx := context.Background()
	big := strings.Repeat("token ", 50_000)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				text := big
				if (w+i)%2 == 0 {
					text = "short"
				}
				if err := j.Record(ctx, journal.Entry{AttemptID: "hot", State: journal.Received, Response: &providers.Response{Text: text}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 200 {
		e, ok, err := j.Lookup(ctx, "hot")
		if err != nil {
			t.Fatalf("a reader saw a broken entry: %v", err)
		}
		if ok && e.Response.Text != big && e.Response.Text != "short" {
			t.Fatalf("a reader saw %d bytes of text", len(e.Response.Text))
		}
	}
	wg.Wait()
}
