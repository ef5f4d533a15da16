// Package testproc runs a server binary (nginx, Caddy) for a test on
// loopback: started, waited on until it listens, stopped when the test
// ends.
package testproc

import (
	"context"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/durallm/durallm/internal/syncbuf"
)

// FreeAddr returns a loopback host:port that was free when asked.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Start starts cmd, which must listen on addr, and returns once addr
// accepts connections. The test fails, with what the process wrote to
// its standard output and error, if it exits first or does not listen
// within 10 s. When the test ends it is interrupted, and killed if it has
// not exited 5 s later.
func Start(t testing.TB, cmd *exec.Cmd, addr string) {
	t.Helper()
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			t.Fatalf("%s exited: %s", cmd.Path, out.String())
		case <-ctx.Done():
			t.Fatalf("%s did not listen on %s: %s", cmd.Path, addr, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
