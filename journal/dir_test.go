package journal

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
)

func TestDirRecordsAndLooksUp(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "journal")}
	ctx := context.Background()
	if _, ok, err := d.Lookup(ctx, "run-1"); ok || err != nil {
		t.Fatalf("empty journal: ok %v err %v", ok, err)
	}
	e := Entry{AttemptID: "run-1", ActionRef: "a", Attempt: 1, State: Received, Class: recovery.Completed,
		Response: &providers.Response{Text: "the answer"}, At: time.Unix(1, 0).UTC()}
	if err := d.Record(ctx, e); err != nil {
		t.Fatal(err)
	}
	got, ok, err := d.Lookup(ctx, "run-1")
	if err != nil || !ok || got.State != Received || got.Response == nil || got.Response.Text != "the answer" || !got.At.Equal(e.At) {
		t.Fatalf("lookup: %+v ok %v err %v", got, ok, err)
	}
	// A later record replaces the earlier one.
	e.State, e.Response = EndedUnanswered, nil
	if err := d.Record(ctx, e); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := d.Lookup(ctx, "run-1"); got.State != EndedUnanswered || got.Response != nil {
		t.Fatalf("replaced: %+v", got)
	}
	// The journal holds generated text: its files are the worker's only.
	info, err := os.Stat(filepath.Join(d.Path, "run-1.json"))
	if err != nil || info.Mode().Perm()&0o077 != 0 {
		t.Fatalf("entry mode %v err %v", info.Mode(), err)
	}
	left, _ := filepath.Glob(filepath.Join(d.Path, ".tmp-*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

func TestDirRefusesIDsThatAreNotKeys(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	for _, id := range []string{"", "../escape", "a/b", ".hidden", strings.Repeat("x", 201), "a b"} {
		if err := d.Record(context.Background(), Entry{AttemptID: id}); !errors.Is(err, ErrBadAttemptID) {
			t.Errorf("Record(%q): %v", id, err)
		}
		if _, _, err := d.Lookup(context.Background(), id); !errors.Is(err, ErrBadAttemptID) {
			t.Errorf("Lookup(%q): %v", id, err)
		}
	}
}

// Readers never see half an entry while writers replace it.
func TestDirReadersSeeWholeEntries(t *testing.T) {
	d := Dir{Path: t.TempDir()}
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
				if err := d.Record(ctx, Entry{AttemptID: "hot", State: Received, Response: &providers.Response{Text: text}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 200 {
		e, ok, err := d.Lookup(ctx, "hot")
		if err != nil {
			t.Fatalf("a reader saw a broken entry: %v", err)
		}
		if ok && e.Response.Text != big && e.Response.Text != "short" {
			t.Fatalf("a reader saw %d bytes of text", len(e.Response.Text))
		}
	}
	wg.Wait()
}

// A journal that cannot be written says so; it never panics.
func TestDirUnwritableIsAnError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d := Dir{Path: filepath.Join(file, "journal")}
	if err := d.Record(context.Background(), Entry{AttemptID: "x"}); err == nil {
		t.Fatal("recorded into a path under a file")
	}
}
