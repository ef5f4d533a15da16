package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/durallm/durallm/internal/syncbuf"
)

func hashOf(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

func TestParseTokens(t *testing.T) {
	cs, err := ParseTokens([]byte(fmt.Sprintf(`
tokens:
  - id: team-a
    sha256: %s
    models: [demo]
    max_in_flight: 2
  - id: ops
    sha256: %s
    role: operator
`, hashOf("tok-a"), hashOf("tok-ops"))))
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].ID != "team-a" || cs[0].MaxInFlight != 2 || !cs[0].mayUse("demo") || cs[0].mayUse("other") || cs[0].Operator() ||
		!cs[1].Operator() || !cs[1].mayUse("anything") {
		t.Fatalf("%+v", cs)
	}
	if cs[0].Budget != nil {
		t.Fatalf("a caller without a budget has one: %+v", cs[0].Budget)
	}
	tk := NewTokens(cs)
	if c, ok := tk.lookup("tok-a"); !ok || c.ID != "team-a" {
		t.Fatalf("tok-a: %+v %v", c, ok)
	}
	for _, bad := range []string{"", "tok-", "tok-a ", "TOK-A", hashOf("tok-a")} {
		if _, ok := tk.lookup(bad); ok {
			t.Errorf("token %q accepted", bad)
		}
	}
}

func TestParseTokensBudget(t *testing.T) {
	cs, err := ParseTokens([]byte("tokens:\n  - id: a\n    sha256: " + hashOf("tok-a") + "\n    budget:\n      tokens: 2000000\n      cost: 50\n      period: month\n"))
	if err != nil {
		t.Fatal(err)
	}
	b := cs[0].Budget
	if b == nil || b.Budget.Tokens != 2000000 || b.Budget.Cost != 50 || b.Period.String() != "month" {
		t.Fatalf("budget %+v", b)
	}
}

func TestParseTokensRefusals(t *testing.T) {
	h := hashOf("x")
	for _, tc := range []struct{ name, yaml, want string }{
		{"no id", "tokens:\n  - sha256: " + h + "\n", "id: empty"},
		{"id twice", "tokens:\n  - id: a\n    sha256: " + h + "\n  - id: a\n    sha256: " + hashOf("y") + "\n", "id: used twice"},
		{"same token twice", "tokens:\n  - id: a\n    sha256: " + h + "\n  - id: b\n    sha256: " + h + "\n", "the same token twice"},
		{"short hash", "tokens:\n  - id: a\n    sha256: abc\n", "sha256"},
		{"a token, not its hash", "tokens:\n  - id: a\n    sha256: my-secret-token\n", "sha256"},
		{"bad role", "tokens:\n  - id: a\n    sha256: " + h + "\n    role: admin\n", "role"},
		{"negative limit", "tokens:\n  - id: a\n    sha256: " + h + "\n    max_in_flight: -1\n", "max_in_flight"},
		{"unknown field", "tokens:\n  - id: a\n    sha256: " + h + "\n    token: x\n", "token"},
		{"budget without a period", "tokens:\n  - id: a\n    sha256: " + h + "\n    budget: {tokens: 1000}\n", "budget.period"},
		{"budget with neither limit", "tokens:\n  - id: a\n    sha256: " + h + "\n    budget: {period: day}\n", "neither tokens nor cost"},
		{"budget of zero", "tokens:\n  - id: a\n    sha256: " + h + "\n    budget: {tokens: 0, cost: 0, period: day}\n", "neither tokens nor cost"},
		{"negative budget", "tokens:\n  - id: a\n    sha256: " + h + "\n    budget: {cost: -5, period: day}\n", "budget.cost: negative"},
		{"absurd budget", "tokens:\n  - id: a\n    sha256: " + h + "\n    budget: {tokens: 1000000000000000, period: day}\n", "budget.tokens: above"},
		{"a period too short", "tokens:\n  - id: a\n    sha256: " + h + "\n    budget: {tokens: 1000, period: 10s}\n", "budget.period"},
		{"an unknown period", "tokens:\n  - id: a\n    sha256: " + h + "\n    budget: {tokens: 1000, period: fortnight}\n", "budget.period"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTokens([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
			if strings.Contains(err.Error(), h) || strings.Contains(err.Error(), "my-secret-token") {
				t.Fatalf("the error quotes a hash or token: %v", err)
			}
		})
	}
}

// Tokens rotate without a restart: the file is read again when it changes
// and on SIGHUP; a broken file keeps the tokens in force.
func TestTokensReloadOnChangeAndHangup(t *testing.T) {
	path := writeFile(t, "tokens.yaml", "tokens:\n  - id: a\n    sha256: "+hashOf("old")+"\n")
	var logs syncbuf.Buffer
	tk, err := LoadTokens(path, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() { tk.Watch(ctx, 5*time.Millisecond, hup); close(done) }()
	defer func() { cancel(); <-done }()

	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	rewrite := func(text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rewrite("tokens:\n  - id: a\n    sha256: " + hashOf("new") + "\n  - id: b\n    sha256: " + hashOf("other") + "\n")
	waitUntil("the change to be read", func() bool { _, ok := tk.lookup("new"); return ok })
	if _, ok := tk.lookup("old"); ok {
		t.Fatal("the rotated-out token still works")
	}
	// A broken file: the tokens stay.
	rewrite("tokens: [")
	time.Sleep(50 * time.Millisecond)
	if _, ok := tk.lookup("new"); !ok {
		t.Fatal("a broken file dropped the tokens")
	}
	// A change the watcher cannot see by size and time (same length,
	// same modification time restored) is read on SIGHUP.
	rewrite("tokens:\n  - id: a\n    sha256: " + hashOf("new") + "\n")
	waitUntil("the fixed file", func() bool { return tk.Len() == 1 })
	st, _ := os.Stat(path)
	rewrite("tokens:\n  - id: a\n    sha256: " + hashOf("hup") + "\n")
	_ = os.Chtimes(path, st.ModTime(), st.ModTime())
	hup <- syscall.SIGHUP
	waitUntil("the hangup reload", func() bool { _, ok := tk.lookup("hup"); return ok })
	for _, secret := range []string{"old", "new", "hup", hashOf("old"), hashOf("new"), hashOf("hup")} {
		if strings.Contains(logs.String(), "sha256: "+secret) || strings.Contains(logs.String(), secret+"\n") || strings.Contains(logs.String(), hashOf(secret)) {
			t.Fatalf("the log holds a token or hash:\n%s", logs.String())
		}
	}
}

func sumOf(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }
