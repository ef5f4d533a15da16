package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/durallm/durallm/gateway/callerbudget"
	"github.com/durallm/durallm/workflows"
)

// RoleOperator is the role that may reconcile, list and steer every
// caller's actions.
const RoleOperator = "operator"

// Caller is one entry of the tokens file: who a bearer token belongs to.
type Caller struct {
	// ID names the caller. It is stable across token rotation: action
	// ids derive from it, so a rotated token finds the same actions.
	ID string
	// Hash is SHA-256 of the token.
	Hash [sha256.Size]byte
	// Models the caller may use; empty means every model.
	Models []string
	// MaxInFlight bounds the caller's requests in progress at once (a
	// stream or a JSON wait each); past it, 429. Zero means no bound.
	MaxInFlight int
	// Role is "" or RoleOperator.
	Role string
	// Budget is the caller's spend limit per period, reserved before
	// each of its actions starts (docs/gateway.md, "Caller budgets").
	// Nil means none.
	Budget *callerbudget.Limit
}

// Operator reports whether the caller has the operator role.
func (c Caller) Operator() bool { return c.Role == RoleOperator }

// mayUse reports whether the caller may use the model.
func (c Caller) mayUse(model string) bool {
	if len(c.Models) == 0 {
		return true
	}
	for _, m := range c.Models {
		if m == model {
			return true
		}
	}
	return false
}

// anonymous is the caller of a gateway without tokens (loopback only).
var anonymous = Caller{ID: "anonymous", Role: RoleOperator}

// ParseTokens reads a tokens file:
//
//	tokens:
//	  - id: team-a
//	    sha256: 9f86d0…  # sha256 of the token, 64 hex digits
//	    models: [demo]  # optional: every model
//	    max_in_flight: 16  # optional: no bound
//	    budget:  # optional: no spend limit
//	      tokens: 2000000  # and/or cost, at the routes' prices
//	      period: day  # day or month (UTC), or a duration such as 6h
//	  - id: ops
//	    sha256: …
//	    role: operator
//
// It returns every problem at once, naming the entry and field, never a
// hash.
func ParseTokens(data []byte) ([]Caller, error) {
	var raw struct {
		Tokens []struct {
			ID          string   `yaml:"id"`
			SHA256      string   `yaml:"sha256"`
			Models      []string `yaml:"models"`
			MaxInFlight int      `yaml:"max_in_flight"`
			Role        string   `yaml:"role"`
			Budget      *struct {
				Tokens int64   `yaml:"tokens"`
				Cost   float64 `yaml:"cost"`
				Period string  `yaml:"period"`
			} `yaml:"budget"`
		} `yaml:"tokens"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	var out []Caller
	var errs []error
	ids, hashes := map[string]bool{}, map[[sha256.Size]byte]bool{}
	for i, t := range raw.Tokens {
		bad := func(field, problem string) {
			errs = append(errs, fmt.Errorf("tokens file: tokens[%d]: %s: %s", i, field, problem))
		}
		c := Caller{ID: strings.TrimSpace(t.ID), Models: t.Models, MaxInFlight: t.MaxInFlight, Role: strings.TrimSpace(t.Role)}
		switch {
		case c.ID == "":
			bad("id", "empty")
		case ids[c.ID]:
			bad("id", "used twice")
		}
		ids[c.ID] = true
		h, err := hex.DecodeString(strings.TrimSpace(t.SHA256))
		if err != nil || len(h) != sha256.Size {
			bad("sha256", "want the token's SHA-256 as 64 hex digits (sha256sum)")
		} else {
			copy(c.Hash[:], h)
			switch {
			case c.Hash == emptyDigest:
				bad("sha256", "the SHA-256 of the empty token (was the token's variable unset when it was hashed?)")
			case hashes[c.Hash]:
				bad("sha256", "the same token twice")
			}
			hashes[c.Hash] = true
		}
		if c.MaxInFlight < 0 {
			bad("max_in_flight", "negative")
		}
		if c.Role != "" && c.Role != RoleOperator {
			bad("role", "want operator or nothing")
		}
		if b := t.Budget; b != nil {
			c.Budget = &callerbudget.Limit{Budget: workflows.Budget{Tokens: b.Tokens, Cost: b.Cost}}
			var err error
			if c.Budget.Period, err = callerbudget.ParsePeriod(b.Period); err != nil {
				bad("budget.period", err.Error())
			}
			for _, err := range c.Budget.Budget.Problems("budget") {
				errs = append(errs, fmt.Errorf("tokens file: tokens[%d]: %w", i, err))
			}
		}
		out = append(out, c)
	}
	if len(raw.Tokens) == 0 {
		// Also what a file read halfway through its rewrite looks like.
		errs = append(errs, errors.New("tokens file: no tokens (a gateway with a tokens file needs at least one)"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// Tokens are the callers the gateway accepts, reloadable while it runs.
// Safe for concurrent use.
type Tokens struct {
	callers atomic.Pointer[[]Caller]
	path    string
	log     *slog.Logger

	mu   sync.Mutex // serialises reloads
	stat fileStamp
}

type fileStamp struct {
	size    int64
	modTime time.Time
}

// NewTokens returns the callers of a fixed list (no file to reload).
func NewTokens(callers []Caller) *Tokens {
	t := &Tokens{log: slog.New(slog.DiscardHandler)}
	t.callers.Store(&callers)
	return t
}

// LoadTokens reads a tokens file; Reload and Watch read it again.
func LoadTokens(path string, log *slog.Logger) (*Tokens, error) {
	if log == nil {
		log = slog.Default()
	}
	t := &Tokens{path: path, log: log}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the file again. On an error the callers stay as they were.
func (t *Tokens) Reload() error {
	if t.path == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	st, err := os.Stat(t.path)
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	data, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	// Remembered whether it parses or not: a broken file is reported
	// once, and read again when it changes.
	t.stat = fileStamp{st.Size(), st.ModTime()}
	callers, err := ParseTokens(data)
	if err != nil {
		return err
	}
	t.callers.Store(&callers)
	return nil
}

// Watch reloads the file when its size or modification time changes
// (checked every interval) and whenever hup receives, until ctx ends. A
// reload that fails is logged (the file's name and the problem, never a
// hash) and the callers stay as they were.
func (t *Tokens) Watch(ctx context.Context, every time.Duration, hup <-chan os.Signal) {
	if t.path == "" {
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		case <-tick.C:
			st, err := os.Stat(t.path)
			t.mu.Lock()
			same := err == nil && (fileStamp{st.Size(), st.ModTime()}) == t.stat
			t.mu.Unlock()
			if same {
				continue
			}
		}
		if err := t.Reload(); err != nil {
			t.log.Error("gateway: tokens file not reloaded; the previous tokens stay in force", "file", t.path, "error", err)
			continue
		}
		t.log.Info("gateway: tokens reloaded", "file", t.path, "callers", len(*t.callers.Load()))
	}
}

// Budgets reports whether a caller has a budget.
func (t *Tokens) Budgets() bool {
	for _, c := range *t.callers.Load() {
		if c.Budget != nil {
			return true
		}
	}
	return false
}

// Len is how many callers there are.
func (t *Tokens) Len() int { return len(*t.callers.Load()) }

// emptyDigest is the SHA-256 of the empty token, which no entry may hold.
var emptyDigest = sha256.Sum256(nil)

// lookup finds the caller a token belongs to. Every entry is compared, in
// constant time, whatever matches: how long it takes says nothing of
// which entry, or how much of a hash, matched.
func (t *Tokens) lookup(token string) (Caller, bool) {
	sum := sha256.Sum256([]byte(token))
	var found Caller
	ok := 0
	for _, c := range *t.callers.Load() {
		if subtle.ConstantTimeCompare(sum[:], c.Hash[:]) == 1 {
			found, ok = c, 1
		}
	}
	return found, ok == 1
}
