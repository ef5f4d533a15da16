package callerbudget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/durallm/durallm/workflows"
)

// ErrFileInUse is returned (wrapped) by OpenFile when another process
// has the spend file open: a file serves one gateway.
var ErrFileInUse = errors.New("callerbudget: the spend file is in use by another process")

// File is a Store in a local JSON file, for one gateway: every change is
// written (to a new file, then renamed over the old one) before the call
// returns, so spending survives the gateway's restart, but no other
// gateway sees it. OpenFile locks the file against a second process. It
// keeps each caller's current period, and earlier ones while they hold:
// a reservation forgets the caller's earlier accounts that hold nothing.
type File struct {
	path   string
	unlock func()

	mu    sync.Mutex
	state fileState
	now   func() time.Time
}

type fileState struct {
	Accounts []fileAccount `json:"accounts"`
	Holds    []Hold        `json:"holds"`
}

type fileAccount struct {
	Caller string `json:"caller"`
	Period string `json:"period"`
	Account
}

// OpenFile opens the spend file at path, made empty when missing, and
// locks it (an advisory lock on path+".lock") until Close: a second
// process opening it gets ErrFileInUse.
func OpenFile(path string) (*File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("callerbudget: spend file: %w", err)
	}
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return nil, err
	}
	f := &File{path: path, unlock: unlock, now: time.Now}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		unlock()
		return nil, fmt.Errorf("callerbudget: spend file: %w", err)
	default:
		if err := json.Unmarshal(data, &f.state); err != nil {
			unlock()
			return nil, fmt.Errorf("callerbudget: spend file %s: %w", path, err)
		}
	}
	return f, nil
}

// Close implements Store: it releases the lock.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unlock != nil {
		f.unlock()
		f.unlock = nil
	}
	return nil
}

func (f *File) account(caller, period string) *fileAccount {
	for i := range f.state.Accounts {
		if a := &f.state.Accounts[i]; a.Caller == caller && a.Period == period {
			return a
		}
	}
	f.state.Accounts = append(f.state.Accounts, fileAccount{Caller: caller, Period: period})
	return &f.state.Accounts[len(f.state.Accounts)-1]
}

// forget drops the caller's accounts of other periods that hold
// nothing: the file keeps each caller's current period and those with
// running actions, so that it stays small however short the period.
func (f *File) forget(caller, period string) {
	kept := f.state.Accounts[:0:0]
	for _, a := range f.state.Accounts {
		if a.Caller != caller || a.Period == period || a.Held != (workflows.Spend{}) {
			kept = append(kept, a)
		}
	}
	f.state.Accounts = kept
}

func (f *File) hold(id string) int {
	for i, h := range f.state.Holds {
		if h.ActionID == id {
			return i
		}
	}
	return -1
}

// write puts the state in the file; on failure the state is put back as
// it was (was), so memory never says what the file does not.
func (f *File) write(was fileState) error {
	data, err := json.Marshal(f.state)
	if err == nil {
		err = writeFile(f.path, data)
	}
	if err != nil {
		f.state = was
		return fmt.Errorf("callerbudget: spend file: %w", err)
	}
	return nil
}

func (f *File) snapshot() fileState {
	return fileState{Accounts: append([]fileAccount(nil), f.state.Accounts...), Holds: append([]Hold(nil), f.state.Holds...)}
}

// Reserve implements Store.
func (f *File) Reserve(_ context.Context, ask Ask) (Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := f.snapshot()
	f.forget(ask.Caller, ask.Period)
	a := f.account(ask.Caller, ask.Period)
	if i := f.hold(ask.ActionID); i >= 0 {
		return Reservation{OK: true, Existing: true, Held: f.state.Holds[i].Spend, Account: a.Account}, nil
	}
	r := decide(a.Account, ask)
	if !r.OK {
		return r, nil
	}
	a.Account = r.Account
	f.state.Holds = append(f.state.Holds, Hold{ActionID: ask.ActionID, Caller: ask.Caller, Period: ask.Period, Spend: r.Held, Made: f.now().UTC()})
	if err := f.write(was); err != nil {
		return Reservation{}, err
	}
	return r, nil
}

// Settle implements Store.
func (f *File) Settle(_ context.Context, actionID string, charged workflows.Spend) (Hold, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.hold(actionID)
	if i < 0 {
		return Hold{}, false, nil
	}
	was := f.snapshot()
	h := f.state.Holds[i]
	f.state.Holds = append(f.state.Holds[:i:i], f.state.Holds[i+1:]...)
	a := f.account(h.Caller, h.Period)
	a.Account = settle(a.Account, h.Spend, charged)
	if err := f.write(was); err != nil {
		return Hold{}, false, err
	}
	return h, true, nil
}

// Account implements Store.
func (f *File) Account(_ context.Context, caller, period string) (Account, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.state.Accounts {
		if a.Caller == caller && a.Period == period {
			return a.Account, nil
		}
	}
	return Account{}, nil
}

// Holds implements Store.
func (f *File) Holds(_ context.Context, madeBefore time.Time, limit int) ([]Hold, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Hold
	for _, h := range f.state.Holds {
		if h.Made.Before(madeBefore) {
			out = append(out, h)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Made.Before(out[j].Made) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// writeFile replaces path with data: a new file, synced, renamed over
// it, so that a crash leaves the old file or the new one, never half.
func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
