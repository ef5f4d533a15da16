// Package testproc runs a server binary (nginx, Caddy) for a test on
// loopback (package proc): started, waited on until it listens, stopped
// when the test ends.
package testproc

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/durallm/durallm/internal/proc"
)

// FreeAddr returns a loopback host:port that was free when asked.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := proc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// Start starts cmd, which must listen on addr, and returns once addr
// accepts connections; the test fails if it does not. When the test ends
// it is interrupted, and killed if it has not exited 5 s later.
func Start(t testing.TB, cmd *exec.Cmd, addr string) {
	t.Helper()
	p, err := proc.Start(context.Background(), cmd, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(os.Interrupt) })
}
