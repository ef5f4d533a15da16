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

// Dir is a Journal on a file system: up to two files per attempt under
// Path, each written atomically (a temporary file, synced, then renamed
// over the entry and the directory synced), so a reader sees the whole of
// an entry or none of it, and a worker killed mid-write leaves no half
// entry. The end of an attempt is <id>.json; its Sent record is <id>.sent,
// a file of its own, and Lookup prefers the end: so a Sent that lands
// after the end (a renewal still in flight, or abandoned and finished
// late) can never hide it, without a lock between writers. Path is
// created (mode 0700) on the first Record. The zero value is not usable.
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

// The files of an attempt: its end (or, written by an older version, a
// Sent), and its Sent record.
const (
	entrySuffix = ".json"
	sentSuffix  = ".sent"
)

// Record writes e to its file: an end to <id>.json, then removes the Sent
// record; a Sent to <id>.sent.
func (d Dir) Record(ctx context.Context, e Entry) error {
	if err := validID(e.AttemptID); err != nil {
		return err
	}
	b, err := encode(e, d.Keys)
	if err != nil {
		return err
	}
	full, unmeasured := d.Bound.full(ctx, d.usage)
	end, sent := d.file(e.AttemptID, entrySuffix), d.file(e.AttemptID, sentSuffix)
	existed := exists(end) || exists(sent)
	switch {
	case full && !existed && unmeasured != nil:
		return unmeasured
	case full && !existed:
		return fmt.Errorf("%w: %s", ErrFull, e.AttemptID)
	}
	if !e.Ended() {
		// The end already written: the Sent is moot. (Not needed for
		// correctness: Lookup prefers the end whatever lands after it.)
		if cur, ok, _ := d.read(end, e.AttemptID); ok && cur.Ended() {
			return nil
		}
		if err := d.write(sent, e.AttemptID, b); err != nil {
			return err
		}
		d.Bound.wrote(!existed, false, len(b))
		return nil
	}
	if err := d.write(end, e.AttemptID, b); err != nil {
		return err
	}
	d.Bound.wrote(!existed, true, len(b))
	// The Sent record says nothing once the end is there; a renewal that
	// lands after this leaves a file Lookup passes over and Delete
	// removes.
	if err := os.Remove(sent); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

// write puts b at final atomically and durably.
func (d Dir) write(final, attemptID string, b []byte) error {
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	tmp, err := os.CreateTemp(d.Path, ".tmp-"+attemptID+"-")
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

// Lookup reads the attempt's end, else its Sent record.
func (d Dir) Lookup(_ context.Context, attemptID string) (Entry, bool, error) {
	if err := validID(attemptID); err != nil {
		return Entry{}, false, err
	}
	end := d.file(attemptID, entrySuffix)
	e, ok, err := d.read(end, attemptID)
	if err != nil || (ok && e.Ended()) {
		return e, ok, err
	}
	s, sok, err := d.read(d.file(attemptID, sentSuffix), attemptID)
	switch {
	case err != nil:
		return Entry{}, false, err
	case sok:
		return s, true, nil
	case ok:
		return e, true, nil // a Sent an older version wrote in place
	}
	// Neither: the end may have been written, and the Sent removed,
	// between the two reads (the end is written first).
	return d.read(end, attemptID)
}

func (d Dir) read(path, attemptID string) (Entry, bool, error) {
	b, err := os.ReadFile(path)
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

// Older calls each for every entry whose files were all written before
// t. An entry stored in the clear while the journal encrypts, refused as
// evidence, still comes with the action it names, so it expires with
// that action; one it cannot read at all comes with an empty ActionRef.
func (d Dir) Older(ctx context.Context, t time.Time, each func(Written) error) error {
	return d.walk(func(f entryFiles) error {
		if !f.written.Before(t) {
			return nil
		}
		w := Written{AttemptID: f.id, At: f.written}
		switch e, ok, err := d.Lookup(ctx, f.id); {
		case err == nil && ok:
			w.ActionRef = e.ActionRef
		case err == nil:
			return nil // deleted meanwhile
		default:
			w.ActionRef = d.clearActionRef(f.id)
		}
		return each(w)
	})
}

// clearActionRef is the action an attempt's entry stored in the clear
// names, for the sweep only: "" when its files are sealed or unreadable.
func (d Dir) clearActionRef(attemptID string) string {
	for _, suffix := range []string{entrySuffix, sentSuffix} {
		if b, err := os.ReadFile(d.file(attemptID, suffix)); err == nil {
			if ref := clearActionRef(b); ref != "" {
				return ref
			}
		}
	}
	return ""
}

// Delete removes the attempts' files.
func (d Dir) Delete(_ context.Context, attemptIDs []string) error {
	var gone Usage
	defer func() { d.Bound.deleted(gone) }()
	for _, id := range attemptIDs {
		if err := validID(id); err != nil {
			return err
		}
		removed := false
		for _, suffix := range []string{entrySuffix, sentSuffix} {
			path := d.file(id, suffix)
			info, serr := os.Stat(path)
			err := os.Remove(path)
			switch {
			case err == nil:
				removed = true
				if serr == nil {
					gone.Bytes += info.Size()
				}
			case !errors.Is(err, fs.ErrNotExist):
				return fmt.Errorf("journal: %w", err)
			}
		}
		if removed {
			gone.Entries++
		}
	}
	return nil
}

// usage measures the directory: its entries and their files' sizes.
func (d Dir) usage(context.Context) (Usage, error) {
	var u Usage
	err := d.walk(func(f entryFiles) error {
		u.Entries++
		u.Bytes += f.size
		return nil
	})
	return u, err
}

// entryFiles is what the directory holds of one attempt: when its newest
// file was written, and the bytes of its files.
type entryFiles struct {
	id      string
	written time.Time
	size    int64
}

// walk calls fn once for every attempt with an entry file (not the
// temporaries), in the order of the listing.
func (d Dir) walk(fn func(entryFiles) error) error {
	des, err := os.ReadDir(d.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	var order []string
	byID := map[string]*entryFiles{}
	for _, de := range des {
		id, ok := strings.CutSuffix(de.Name(), entrySuffix)
		if !ok {
			id, ok = strings.CutSuffix(de.Name(), sentSuffix)
		}
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
		f := byID[id]
		if f == nil {
			f = &entryFiles{id: id}
			byID[id] = f
			order = append(order, id)
		}
		f.size += info.Size()
		if info.ModTime().After(f.written) {
			f.written = info.ModTime()
		}
	}
	for _, id := range order {
		if err := fn(*byID[id]); err != nil {
			return err
		}
	}
	return nil
}

func (d Dir) file(attemptID, suffix string) string {
	return filepath.Join(d.Path, attemptID+suffix)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
