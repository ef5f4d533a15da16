package resultstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Dir keeps an action's claim on a result as a file
// claims/<sha256>/<claimName(action)> holding the action's id, its
// modification time when it was last written. A PutFor writes the claim
// before the data; a Release removes claims, then moves a result no claim
// is left on aside, looks at its claims again and puts it back if one
// appeared meanwhile (a PutFor of the same data for another action),
// else deletes it. So a result a PutFor has returned is never lost.

const (
	claimsDir = "claims"
	tmpMark   = ".tmp-"
)

// claimName is the file name of an action's claim: a digest of its id,
// which may hold any character.
func claimName(actionRef string) string {
	sum := sha256.Sum256([]byte(actionRef))
	return hex.EncodeToString(sum[:16])
}

// PutFor stores data for the action actionRef: its claim first, then the
// data (as Put).
func (d Dir) PutFor(ctx context.Context, actionRef string, data []byte) (string, error) {
	if err := CheckSize(int64(len(data)), d.Limit()); err != nil {
		return "", err
	}
	ref := Ref(fileScheme, data)
	name := strings.TrimPrefix(ref, fileScheme+":")
	if err := d.claim(name, actionRef); err != nil {
		return "", err
	}
	return d.Put(ctx, data)
}

// claim writes the action's claim on the result name, atomically. A
// Release may remove the claims directory between the two steps; then it
// is made again.
func (d Dir) claim(name, actionRef string) error {
	dir := filepath.Join(d.Path, claimsDir, name)
	var err error
	for range 3 {
		if err = os.MkdirAll(dir, 0o700); err != nil {
			break
		}
		var tmp *os.File
		if tmp, err = os.CreateTemp(dir, tmpMark+"*"); errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			break
		}
		_, werr := tmp.WriteString(actionRef)
		cerr := tmp.Close()
		if err = errors.Join(werr, cerr); err == nil {
			err = os.Rename(tmp.Name(), filepath.Join(dir, claimName(actionRef)))
		}
		if err != nil {
			os.Remove(tmp.Name())
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
		}
		break
	}
	if err != nil {
		return fmt.Errorf("resultstore: claim a result in %s: %w", d.Path, err)
	}
	return nil
}

// Older lists the claims last written before t.
func (d Dir) Older(ctx context.Context, t time.Time, each func(Claim) error) error {
	root := filepath.Join(d.Path, claimsDir)
	results, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("resultstore: list claims: %w", err)
	}
	for _, r := range results {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := Digest(fileScheme, fileScheme+":"+r.Name()); err != nil {
			continue
		}
		claims, err := os.ReadDir(filepath.Join(root, r.Name()))
		if err != nil {
			continue // released meanwhile
		}
		for _, c := range claims {
			if strings.HasPrefix(c.Name(), tmpMark) {
				continue
			}
			info, err := c.Info()
			if err != nil || !info.ModTime().Before(t) {
				continue
			}
			b, err := os.ReadFile(filepath.Join(root, r.Name(), c.Name()))
			if err != nil {
				continue
			}
			action := string(b)
			if claimName(action) != c.Name() {
				action = "" // damaged: kept
			}
			if err := each(Claim{Ref: fileScheme + ":" + r.Name(), ActionRef: action, At: info.ModTime()}); err != nil {
				return err
			}
		}
	}
	return nil
}

// Release removes the claims and deletes the results no claim is left on.
func (d Dir) Release(ctx context.Context, claims []Claim) (int, error) {
	names := map[string]bool{}
	for _, c := range claims {
		name, err := Digest(fileScheme, c.Ref)
		if err != nil {
			return 0, err
		}
		err = os.Remove(filepath.Join(d.Path, claimsDir, name, claimName(c.ActionRef)))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("resultstore: release %s: %w", c.Ref, err)
		}
		names[name] = true
	}
	deleted := 0
	for name := range names {
		gone, err := d.deleteUnclaimed(name)
		if err != nil {
			return deleted, err
		}
		if gone {
			deleted++
		}
	}
	return deleted, nil
}

// deleteUnclaimed deletes the result name if no claim is left on it (a
// claim being written counts).
func (d Dir) deleteUnclaimed(name string) (bool, error) {
	dir := filepath.Join(d.Path, claimsDir, name)
	if claimed(dir) {
		return false, nil
	}
	if beforeSetAside != nil {
		beforeSetAside()
	}
	final := filepath.Join(d.Path, name)
	aside := final + ".expired-" + rand.Text()
	if err := os.Rename(final, aside); errors.Is(err, fs.ErrNotExist) {
		return false, nil // another sweeper's, or never written
	} else if err != nil {
		return false, fmt.Errorf("resultstore: expire %s: %w", name, err)
	}
	if claimed(dir) {
		// Claimed again while it was set aside: the PutFor that claimed it
		// may have seen it there and not written it.
		if err := os.Rename(aside, final); err != nil {
			return false, fmt.Errorf("resultstore: keep %s: %w", name, err)
		}
		return false, nil
	}
	if err := os.Remove(aside); err != nil {
		return false, fmt.Errorf("resultstore: expire %s: %w", name, err)
	}
	_ = os.Remove(dir) // only when empty; a claim arriving now makes it again
	return true, nil
}

// claimed reports whether a claims directory holds a claim, or one being
// written. One that cannot be read counts as claimed. A claim left half
// written for an hour is a crashed writer's, and is removed.
func claimed(dir string) bool {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), tmpMark) && time.Since(info.ModTime()) > staleClaim {
			_ = os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		return true
	}
	return false
}

// beforeSetAside, when set (by a test), runs between the look for claims
// and setting the result aside: where a PutFor that finds the result
// still there must not lose it.
var beforeSetAside func()

// staleClaim is how old a half-written claim must be to be a crashed
// writer's: a write takes milliseconds.
const staleClaim = time.Hour
