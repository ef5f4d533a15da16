package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Dir is a Journal on a file system: one file per attempt under Path,
// written atomically (a temporary file, synced, then renamed over the
// entry and the directory synced), so a reader sees the whole of an entry
// or none of it, and a worker killed mid-write leaves no half entry. Path
// is created (mode 0700) on the first Record. The zero value is not
// usable.
type Dir struct {
	// Path is the journal's directory. Workers that must read each
	// other's entries share it.
	Path string
}

// Record writes e to its file.
func (d Dir) Record(_ context.Context, e Entry) error {
	if err := validID(e.AttemptID); err != nil {
		return err
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("journal: encode entry: %w", err)
	}
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	tmp, err := os.CreateTemp(d.Path, ".tmp-"+e.AttemptID+"-")
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("journal: write entry: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("journal: sync entry: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if !e.Ended() {
		// Sent replaces only Sent (see Journal.Record for why checking
		// first is enough).
		if cur, ok, _ := d.Lookup(context.Background(), e.AttemptID); ok && cur.Ended() {
			return nil
		}
	}
	if err := os.Rename(tmp.Name(), d.file(e.AttemptID)); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	// The rename is durable only once the directory is.
	dir, err := os.Open(d.Path)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("journal: sync directory: %w", err)
	}
	return nil
}

// Lookup reads the attempt's file.
func (d Dir) Lookup(_ context.Context, attemptID string) (Entry, bool, error) {
	if err := validID(attemptID); err != nil {
		return Entry{}, false, err
	}
	b, err := os.ReadFile(d.file(attemptID))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Entry{}, false, nil
	case err != nil:
		return Entry{}, false, fmt.Errorf("journal: %w", err)
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return Entry{}, false, fmt.Errorf("journal: entry for %s is unreadable: %w", attemptID, err)
	}
	return e, true, nil
}

func (d Dir) file(attemptID string) string { return filepath.Join(d.Path, attemptID+".json") }
