package journal_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/journal/journaltest"
	"github.com/durallm/durallm/providers"
)

func TestDir(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) journal.Journal { return journal.Dir{Path: filepath.Join(t.TempDir(), "journal")} })
}

func TestDirFilesAreTheWorkersOnly(t *testing.T) {
	d := journal.Dir{Path: filepath.Join(t.TempDir(), "journal")}
	if err := d.Record(context.Background(), journal.Entry{AttemptID: "run-1", State: journal.Received, Response: &providers.Response{Text: "x"}}); err != nil {
		t.Fatal(err)
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

// A journal that cannot be written says so; it never panics.
func TestDirUnwritableIsAnError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d := journal.Dir{Path: filepath.Join(file, "journal")}
	if err := d.Record(context.Background(), journal.Entry{AttemptID: "x", State: journal.Received}); err == nil {
		t.Fatal("recorded into a path under a file")
	}
}

func TestDirSealed(t *testing.T) {
	journaltest.RunSealed(t, func(t *testing.T) journaltest.Storage {
		path := filepath.Join(t.TempDir(), "journal")
		return journaltest.Storage{
			Open: func(_ *testing.T, keys *codec.Keyring) journal.Journal { return journal.Dir{Path: path, Keys: keys} },
			Raw: func(t *testing.T, id string) []byte {
				b, err := os.ReadFile(filepath.Join(path, id+".json"))
				if err != nil {
					t.Fatal(err)
				}
				return b
			},
			Plant: func(t *testing.T, id string, raw []byte) {
				if err := os.MkdirAll(path, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(path, id+".json"), raw, 0o600); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}

func TestDirExpirable(t *testing.T) {
	journaltest.RunExpirable(t, func(t *testing.T, b *journal.Bound) journal.Expirable {
		return journal.Dir{Path: filepath.Join(t.TempDir(), "journal"), Bound: b}
	})
}

// An attempt's end and a Sent record that landed after it are one entry:
// Lookup gives the end, the sweeper lists it once and deletes both files,
// and the bound counts it once.
func TestDirCountsAnAttemptsTwoFilesAsOneEntry(t *testing.T) {
	ctx := context.Background()
	d := journal.Dir{Path: filepath.Join(t.TempDir(), "journal"), Bound: &journal.Bound{MaxEntries: 2, Refresh: time.Nanosecond}}
	if err := d.Record(ctx, journal.Entry{AttemptID: "a", ActionRef: "act", State: journal.Sent, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	sent, err := os.ReadFile(filepath.Join(d.Path, "a.sent"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Record(ctx, journal.Entry{AttemptID: "a", ActionRef: "act", State: journal.Received, Response: &providers.Response{Text: "x"}}); err != nil {
		t.Fatal(err)
	}
	// A renewal abandoned in flight lands after the end.
	if err := os.WriteFile(filepath.Join(d.Path, "a.sent"), sent, 0o600); err != nil {
		t.Fatal(err)
	}
	if e, ok, err := d.Lookup(ctx, "a"); err != nil || !ok || e.State != journal.Received {
		t.Fatalf("lookup: %+v ok %v err %v", e, ok, err)
	}
	var listed []string
	if err := d.Older(ctx, time.Now().Add(time.Minute), func(w journal.Written) error {
		listed = append(listed, w.AttemptID+"/"+w.ActionRef)
		return nil
	}); err != nil || len(listed) != 1 || listed[0] != "a/act" {
		t.Fatalf("older: %v err %v", listed, err)
	}
	if err := d.Record(ctx, journal.Entry{AttemptID: "b", State: journal.Received}); err != nil {
		t.Fatalf("the second entry: %v", err)
	}
	// The bound measures in the background: wait for a measurement that
	// has seen both.
	for give := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := d.Record(ctx, journal.Entry{AttemptID: "c", State: journal.Received})
		if errors.Is(err, journal.ErrFull) {
			break
		}
		if err != nil || time.Now().After(give) {
			t.Fatalf("a third entry at a bound of two: %v", err)
		}
		if err := d.Delete(ctx, []string{"c"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Delete(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(d.Path, "a.*")); len(left) != 0 {
		t.Fatalf("files left after delete: %v", left)
	}
}

func TestDirWhileMeasuringFails(t *testing.T) {
	journaltest.RunWhileMeasuringFails(t, func(t *testing.T, b *journal.Bound) journal.Expirable {
		return journal.Dir{Path: filepath.Join(t.TempDir(), "journal"), Bound: b}
	}, journal.FailMeasuring)
}
