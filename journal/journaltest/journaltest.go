// Package journaltest is the behaviour every attempt journal backend
// promises (journal.Journal), as one test suite each backend runs against
// a real instance of itself.
package journaltest

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/codec/codectest"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
)

// Run runs the suite. open returns an empty journal for one subtest.
func Run(t *testing.T, open func(t *testing.T) journal.Journal) {
	t.Run("RecordsAndLooksUp", func(t *testing.T) { recordsAndLooksUp(t, open(t)) })
	t.Run("SentNeverHidesTheEnd", func(t *testing.T) { sentNeverHidesTheEnd(t, open(t)) })
	t.Run("ASentInFlightNeverHidesTheEnd", func(t *testing.T) { sentInFlightNeverHidesTheEnd(t, open(t)) })
	t.Run("RefusesIDsThatAreNotKeys", func(t *testing.T) { refusesBadIDs(t, open(t)) })
	t.Run("ReadersSeeWholeEntries", func(t *testing.T) { readersSeeWholeEntries(t, open(t)) })
}

func recordsAndLooksUp(t *testing.T, j journal.Journal) {
	ctx := context.Background()
	if _, ok, err := j.Lookup(ctx, "run-1"); ok || err != nil {
		t.Fatalf("empty journal: ok %v err %v", ok, err)
	}
	e := journal.Entry{AttemptID: "run-1", ActionRef: "a", Attempt: 1, State: journal.Received, Class: evidence.Completed,
		Response: &providers.Response{Text: "the answer"}, At: time.Unix(1, 0).UTC()}
	if err := j.Record(ctx, e); err != nil {
		t.Fatal(err)
	}
	got, ok, err := j.Lookup(ctx, "run-1")
	if err != nil || !ok || got.State != journal.Received || got.Response == nil || got.Response.Text != "the answer" ||
		!got.At.Equal(e.At) || got.ActionRef != "a" || got.Attempt != 1 || got.Class != evidence.Completed {
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

// Renewals in flight when the end is written land after it: a worker
// does not wait for them (a journal write may hang), so the backend
// itself keeps every Sent from hiding the end, whatever the timing.
func sentInFlightNeverHidesTheEnd(t *testing.T, j journal.Journal) {
	ctx := context.Background()
	for round := range 10 {
		id := "race-" + strconv.Itoa(round)
		if err := j.Record(ctx, journal.Entry{AttemptID: id, State: journal.Sent, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if err := j.Record(ctx, journal.Entry{AttemptID: id, State: journal.Sent, At: time.Now()}); err != nil {
						t.Error(err)
						return
					}
					select {
					case <-stop:
						return
					default:
					}
				}
			}()
		}
		if err := j.Record(ctx, journal.Entry{AttemptID: id, State: journal.Received, Response: &providers.Response{Text: "the end"}}); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		if e, ok, err := j.Lookup(ctx, id); err != nil || !ok || e.State != journal.Received || e.Response == nil {
			t.Fatalf("round %d: a Sent in flight hid the end: %+v ok %v err %v", round, e, ok, err)
		}
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

// Storage is one empty journal's storage, for the encryption suite.
type Storage struct {
	// Open returns a journal on this storage that encrypts with keys
	// (nil: in the clear). Journals opened on one storage see the same
	// entries.
	Open func(t *testing.T, keys *codec.Keyring) journal.Journal
	// Raw returns the bytes the storage holds for the attempt's entry
	// (the file, the row) of a received response.
	Raw func(t *testing.T, attemptID string) []byte
	// Plant stores raw as the attempt's received entry, as someone who
	// can write the storage but holds no key could.
	Plant func(t *testing.T, attemptID string, raw []byte)
}

// RunSealed runs the encryption suite: with a keyring, what the storage
// holds is not the text; after a rotation, entries sealed by the old key
// still read; an entry not sealed is refused, and so is one filed under
// another attempt than its own, sealed or not.
func RunSealed(t *testing.T, storage func(t *testing.T) Storage) {
	t.Run("StoredBytesHoldNoText", func(t *testing.T) { storedBytesHoldNoText(t, storage(t)) })
	t.Run("ReadsAfterKeyRotation", func(t *testing.T) { readsAfterRotation(t, storage(t)) })
	t.Run("WithAKeyringAnUnsealedEntryIsRefused", func(t *testing.T) { refusesUnsealedEntries(t, storage(t)) })
	t.Run("AnEntryFiledUnderAnotherAttemptIsRefused", func(t *testing.T) { refusesAnotherAttemptsEntry(t, storage(t)) })
	t.Run("WithAKeyringEntriesStoredInTheClearAreStillSwept", func(t *testing.T) { sweepsClearEntries(t, storage(t)) })
}

// An entry stored in the clear is refused as evidence once encryption is
// on, but it still belongs to its action: the sweep lists it with that
// action, so it expires with it rather than staying for good.
func sweepsClearEntries(t *testing.T, s Storage) {
	ctx := context.Background()
	if err := s.Open(t, nil).Record(ctx, received("run-clear")); err != nil {
		t.Fatal(err)
	}
	j, ok := s.Open(t, codectest.Ring(t, codectest.Line(t, "k1"))).(journal.Expirable)
	if !ok {
		t.Skip("the journal cannot expire its entries")
	}
	got := map[string]string{}
	if err := j.Older(ctx, time.Now().Add(time.Minute), func(w journal.Written) error {
		got[w.AttemptID] = w.ActionRef
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got["run-clear"] != "action-1" {
		t.Fatalf("the entry stored in the clear is listed for action %q, want action-1 (an empty action keeps it for good)", got["run-clear"])
	}
}

const secret = "the provider's secret answer"

func received(id string) journal.Entry {
	return journal.Entry{AttemptID: id, ActionRef: "action-1", Attempt: 1, State: journal.Received,
		Class: evidence.Completed, Response: &providers.Response{Text: secret}}
}

func storedBytesHoldNoText(t *testing.T, s Storage) {
	ctx := context.Background()
	j := s.Open(t, codectest.Ring(t, codectest.Line(t, "k1")))
	if err := j.Record(ctx, received("run-1")); err != nil {
		t.Fatal(err)
	}
	raw := s.Raw(t, "run-1")
	if len(raw) == 0 || bytes.Contains(raw, []byte(secret)) || bytes.Contains(raw, []byte("secret")) || !codec.Sealed(raw) {
		t.Fatalf("stored: %q", raw)
	}
	if e, ok, err := j.Lookup(ctx, "run-1"); err != nil || !ok || e.Response.Text != secret {
		t.Fatalf("lookup: %+v %v %v", e, ok, err)
	}
	// Without the keyring the entry is an error that says so, never
	// garbage and never a missing entry.
	if _, _, err := s.Open(t, nil).Lookup(ctx, "run-1"); !errors.Is(err, journal.ErrEncrypted) {
		t.Fatalf("lookup without keys: %v", err)
	}
}

func readsAfterRotation(t *testing.T, s Storage) {
	ctx := context.Background()
	k1, k2 := codectest.Line(t, "k1"), codectest.Line(t, "k2")
	if err := s.Open(t, codectest.Ring(t, k1)).Record(ctx, received("run-old")); err != nil {
		t.Fatal(err)
	}
	rotated := s.Open(t, codectest.Ring(t, k2, k1))
	if e, ok, err := rotated.Lookup(ctx, "run-old"); err != nil || !ok || e.Response.Text != secret {
		t.Fatalf("old entry after rotation: %+v %v %v", e, ok, err)
	}
	if err := rotated.Record(ctx, received("run-new")); err != nil {
		t.Fatal(err)
	}
	// The new entry is sealed with k2: a ring that dropped k2 cannot
	// read it, and says which key it lacks.
	if _, _, err := s.Open(t, codectest.Ring(t, k1)).Lookup(ctx, "run-new"); !errors.Is(err, codec.ErrUnknownKey) {
		t.Fatalf("new entry with the old ring: %v", err)
	}
}

// With a keyring, only what a holder of the keys sealed reads: anyone who
// can write the storage could otherwise plant a received answer the
// reconciler settles an action with.
func refusesUnsealedEntries(t *testing.T, s Storage) {
	ctx := context.Background()
	if err := s.Open(t, nil).Record(ctx, received("run-clear")); err != nil {
		t.Fatal(err)
	}
	j := s.Open(t, codectest.Ring(t, codectest.Line(t, "k1")))
	if e, ok, err := j.Lookup(ctx, "run-clear"); !errors.Is(err, journal.ErrUnsealed) || ok || e.Response != nil {
		t.Fatalf("an unsealed entry with encryption on: %+v ok %v err %v", e, ok, err)
	}
	if err := j.Record(ctx, received("run-sealed")); err != nil {
		t.Fatal(err)
	}
	s.Plant(t, "run-planted", []byte(`{"attempt_id":"run-planted","state":"received","class":"completed","response":{"text":"planted"}}`))
	if e, ok, err := j.Lookup(ctx, "run-planted"); !errors.Is(err, journal.ErrUnsealed) || ok || e.Response != nil {
		t.Fatalf("a planted entry with encryption on: %+v ok %v err %v", e, ok, err)
	}
}

// An entry is read only under its own attempt id: one copied to another
// attempt's place does not open (sealed, the seal is bound to the id) or
// is refused (clear, by the id it holds).
func refusesAnotherAttemptsEntry(t *testing.T, s Storage) {
	ctx := context.Background()
	clear := s.Open(t, nil)
	if err := clear.Record(ctx, received("run-a")); err != nil {
		t.Fatal(err)
	}
	s.Plant(t, "run-b", s.Raw(t, "run-a"))
	if e, ok, err := clear.Lookup(ctx, "run-b"); !errors.Is(err, journal.ErrOtherAttempt) || ok || e.Response != nil {
		t.Fatalf("run-a's clear entry under run-b: %+v ok %v err %v", e, ok, err)
	}
	s.Plant(t, "run-c", []byte(`{"state":"received","class":"completed","response":{"text":"no id"}}`))
	if _, ok, err := clear.Lookup(ctx, "run-c"); !errors.Is(err, journal.ErrOtherAttempt) || ok {
		t.Fatalf("an entry with no attempt id: ok %v err %v", ok, err)
	}
	sealed := s.Open(t, codectest.Ring(t, codectest.Line(t, "k1")))
	if err := sealed.Record(ctx, received("run-d")); err != nil {
		t.Fatal(err)
	}
	s.Plant(t, "run-e", s.Raw(t, "run-d"))
	if e, ok, err := sealed.Lookup(ctx, "run-e"); !errors.Is(err, codec.ErrAuthentication) || ok || e.Response != nil {
		t.Fatalf("run-d's sealed entry under run-e: %+v ok %v err %v", e, ok, err)
	}
}

// RunExpirable runs the suite of a journal's lifecycle: listing and
// deleting old entries (what the sweeper uses), and the size bound.
// open returns an empty journal with bound b (nil: unbounded).
func RunExpirable(t *testing.T, open func(t *testing.T, b *journal.Bound) journal.Expirable) {
	t.Run("ListsAndDeletesOldEntries", func(t *testing.T) { listsAndDeletes(t, open(t, nil)) })
	t.Run("AtMaxEntriesNewAttemptsAreRefused", func(t *testing.T) {
		atMaxEntries(t, open(t, &journal.Bound{MaxEntries: 3, Refresh: time.Hour}))
	})
	t.Run("AtMaxBytesNewAttemptsAreRefused", func(t *testing.T) {
		atMaxBytes(t, open(t, &journal.Bound{MaxBytes: 10_000, Refresh: time.Hour}))
	})
}

func listsAndDeletes(t *testing.T, j journal.Expirable) {
	ctx := context.Background()
	before := time.Now().Add(-time.Minute)
	for i, id := range []string{"a-1", "a-2", "b-1"} {
		e := received(id)
		e.ActionRef = map[bool]string{true: "action-a", false: "action-b"}[i < 2]
		if err := j.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	older := func(at time.Time) map[string]string {
		got := map[string]string{}
		if err := j.Older(ctx, at, func(w journal.Written) error {
			if w.At.IsZero() {
				t.Errorf("%s: no time", w.AttemptID)
			}
			got[w.AttemptID] = w.ActionRef
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := older(before); len(got) != 0 {
		t.Fatalf("entries older than a minute ago: %v", got)
	}
	got := older(time.Now().Add(time.Minute))
	if len(got) != 3 || got["a-1"] != "action-a" || got["a-2"] != "action-a" || got["b-1"] != "action-b" {
		t.Fatalf("older than a minute ahead: %v", got)
	}
	if err := j.Delete(ctx, []string{"a-1", "a-2", "never-written"}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := j.Lookup(ctx, "a-1"); ok {
		t.Fatal("a deleted entry is still there")
	}
	if got := older(time.Now().Add(time.Minute)); len(got) != 1 || got["b-1"] != "action-b" {
		t.Fatalf("after delete: %v", got)
	}
}

// At the bound, nothing is dropped: a new attempt is refused with
// ErrFull, and an attempt already journaled still records its end.
func atMaxEntries(t *testing.T, j journal.Expirable) {
	ctx := context.Background()
	for _, id := range []string{"e-1", "e-2", "e-3"} {
		if err := j.Record(ctx, journal.Entry{AttemptID: id, State: journal.Sent}); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []journal.Entry{{AttemptID: "e-4", State: journal.Sent}, received("e-4")} {
		if err := j.Record(ctx, e); !errors.Is(err, journal.ErrFull) {
			t.Fatalf("a fourth attempt (%s): %v", e.State, err)
		}
	}
	if _, ok, _ := j.Lookup(ctx, "e-4"); ok {
		t.Fatal("a refused attempt was written")
	}
	if err := j.Record(ctx, received("e-2")); err != nil {
		t.Fatalf("the end of a journaled attempt at the bound: %v", err)
	}
	if e, _, _ := j.Lookup(ctx, "e-2"); e.State != journal.Received {
		t.Fatalf("the end was not written: %+v", e)
	}
	if err := j.Record(ctx, journal.Entry{AttemptID: "e-2", State: journal.Sent}); err != nil {
		t.Fatalf("a late Sent at the bound: %v", err)
	}
	// A Sent renewed at the bound is still written: it replaces itself.
	renewed := time.Unix(60, 0).UTC()
	if err := j.Record(ctx, journal.Entry{AttemptID: "e-3", State: journal.Sent, At: renewed}); err != nil {
		t.Fatalf("a Sent renewed at the bound: %v", err)
	}
	if e, _, _ := j.Lookup(ctx, "e-3"); !e.At.Equal(renewed) {
		t.Fatalf("the renewal was not written: %+v", e)
	}
	for _, id := range []string{"e-1", "e-3"} {
		if e, ok, _ := j.Lookup(ctx, id); !ok || e.State != journal.Sent {
			t.Fatalf("%s was dropped at the bound: %+v", id, e)
		}
	}
	// Deleting makes room.
	if err := j.Delete(ctx, []string{"e-1"}); err != nil {
		t.Fatal(err)
	}
	if err := j.Record(ctx, received("e-4")); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
}

func atMaxBytes(t *testing.T, j journal.Expirable) {
	ctx := context.Background()
	big := received("b-1")
	big.Response.Text = strings.Repeat("x", 20_000)
	if err := j.Record(ctx, big); err != nil {
		t.Fatalf("under the bound: %v", err)
	}
	if err := j.Record(ctx, received("b-2")); !errors.Is(err, journal.ErrFull) {
		t.Fatalf("past the bound: %v", err)
	}
}

// RunWhileMeasuringFails runs the suite of a journal whose size
// measurement fails (a scan past statement_timeout, say): a new attempt
// is not journaled, as at the bound, with the measurement's error, but
// the end of an attempt that already has an entry, and its renewals, are
// written. open returns an empty journal with bound b; fail makes every
// measurement of b fail with err from then on.
func RunWhileMeasuringFails(t *testing.T, open func(t *testing.T, b *journal.Bound) journal.Expirable, fail func(b *journal.Bound, err error)) {
	t.Run("WhileMeasuringFailsTheEndOfAJournaledAttemptIsWritten", func(t *testing.T) {
		ctx := context.Background()
		b := &journal.Bound{MaxEntries: 1 << 40, Refresh: time.Nanosecond}
		j := open(t, b)
		errMeasure := errors.New("canceling statement due to statement timeout")
		fail(b, errMeasure)
		if err := j.Record(ctx, journal.Entry{AttemptID: "m-1", State: journal.Sent}); err != nil {
			t.Fatalf("before any measurement ended: %v", err)
		}
		// The measurement runs in the background: wait for its failure to
		// show on an attempt with no entry.
		for i := 0; ; i++ {
			err := j.Record(ctx, journal.Entry{AttemptID: "probe-" + strconv.Itoa(i), State: journal.Sent})
			if errors.Is(err, errMeasure) {
				break
			}
			if err != nil {
				t.Fatalf("a new attempt while measuring fails: %v, want the measurement's error", err)
			}
			if i > 2000 {
				t.Fatal("the failing measurement never showed")
			}
			time.Sleep(5 * time.Millisecond)
		}
		renewed := time.Unix(70, 0).UTC()
		if err := j.Record(ctx, journal.Entry{AttemptID: "m-1", State: journal.Sent, At: renewed}); err != nil {
			t.Fatalf("the renewal of a journaled attempt while measuring fails: %v", err)
		}
		if err := j.Record(ctx, received("m-1")); err != nil {
			t.Fatalf("the end of a journaled attempt while measuring fails: %v", err)
		}
		if e, ok, err := j.Lookup(ctx, "m-1"); err != nil || !ok || e.State != journal.Received {
			t.Fatalf("the end was not written: %+v %v %v", e, ok, err)
		}
		if err := j.Record(ctx, received("m-new")); !errors.Is(err, errMeasure) {
			t.Fatalf("the end of an attempt with no entry while measuring fails: %v, want the measurement's error", err)
		}
		if _, ok, _ := j.Lookup(ctx, "m-new"); ok {
			t.Fatal("a refused attempt has an entry")
		}
	})
}
