package journal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/durallm/durallm/codec"
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
	// Keys, when set, encrypts each entry with the payload keyring's
	// active key; entries sealed by any key of the ring are read, and an
	// entry stored in the clear is refused (ErrUnsealed).
	Keys *codec.Keyring
	// Bound, when set, bounds the journal's size (ErrFull). One Bound per
	// journal: it keeps the journal's measurement.
	Bound *Bound
}

const entrySuffix = ".json"

// Record writes e to its file.
func (d Dir) Record(ctx context.Context, e Entry) error {
	if err := validID(e.AttemptID); err != nil {
		return err
	}
	b, err := encode(e, d.Keys)
	if err != nil {
		return err
	}
	full, err := d.Bound.full(ctx, d.usage)
	if err != nil {
		return err
	}
	final := d.file(e.AttemptID)
	_, serr := os.Stat(final)
	existed := serr == nil
	if full && !existed {
		return fmt.Errorf("%w: %s", ErrFull, e.AttemptID)
	}
	if existed && !e.Ended() {
		// Sent replaces only Sent (see Journal.Record for why checking
		// first is enough).
		if cur, ok, _ := d.Lookup(ctx, e.AttemptID); ok && cur.Ended() {
			return nil
		}
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
	if err := os.Rename(tmp.Name(), final); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	d.Bound.wrote(!existed, e.Ended(), len(b))
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
	e, err := decode(b, attemptID, d.Keys)
	if err != nil {
		return Entry{}, false, err
	}
	return e, true, nil
}

// Older calls each for every entry whose file was written before t. An
// entry it cannot read comes with an empty ActionRef.
func (d Dir) Older(ctx context.Context, t time.Time, each func(Written) error) error {
	return d.walk(func(id string, info fs.FileInfo) error {
		if !info.ModTime().Before(t) {
			return nil
		}
		w := Written{AttemptID: id, At: info.ModTime()}
		if e, ok, err := d.Lookup(ctx, id); err == nil && ok {
			w.ActionRef = e.ActionRef
		} else if err == nil {
			return nil // deleted meanwhile
		}
		return each(w)
	})
}

// Delete removes the attempts' files.
func (d Dir) Delete(_ context.Context, attemptIDs []string) error {
	defer d.Bound.forget()
	for _, id := range attemptIDs {
		if err := validID(id); err != nil {
			return err
		}
		if err := os.Remove(d.file(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("journal: %w", err)
		}
	}
	return nil
}

// usage measures the directory: its entry files and their sizes.
func (d Dir) usage(context.Context) (Usage, error) {
	var u Usage
	err := d.walk(func(_ string, info fs.FileInfo) error {
		u.Entries++
		u.Bytes += info.Size()
		return nil
	})
	return u, err
}

// walk calls fn for every entry file (not the temporaries).
func (d Dir) walk(fn func(attemptID string, info fs.FileInfo) error) error {
	des, err := os.ReadDir(d.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	for _, de := range des {
		id, ok := strings.CutSuffix(de.Name(), entrySuffix)
		if !ok || validID(id) != nil || !de.Type().IsRegular() {
			continue
		}
		info, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		if err := fn(id, info); err != nil {
			return err
		}
	}
	return nil
}

func (d Dir) file(attemptID string) string { return filepath.Join(d.Path, attemptID+entrySuffix) }
