// Package proc runs a server binary (haproxy, nginx, Caddy) on loopback
// for the project's harnesses and tests: started, waited on until it
// listens, stopped. Packages haproxy and nginx write their servers'
// configuration and run them through it; testproc is its form for tests.
package proc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/durallm/durallm/internal/syncbuf"
)

// FreeAddr picks a loopback host:port that was free when asked.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("proc: pick a port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Proc is a running server. Its methods are safe for concurrent use.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  syncbuf.Buffer
}

// listenWithin bounds how long a server may take to listen.
const listenWithin = 10 * time.Second

// Start starts cmd, which must listen on addr, and returns once addr
// accepts connections. If the process exits first, or does not listen
// within 10 s (it is then killed), the error says so with what it wrote
// to its standard output and error. The process dies with its parent, so
// a harness killed without its clean-up leaves no server behind.
func Start(ctx context.Context, cmd *exec.Cmd, addr string) (*Proc, error) {
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("proc: start %s: %w", cmd.Path, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	ctx, cancel := context.WithTimeout(ctx, listenWithin)
	defer cancel()
	for {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("proc: %s exited before it listened on %s: %s", cmd.Path, addr, p.out.String())
		case <-ctx.Done():
			p.Stop(syscall.SIGKILL)
			return nil, fmt.Errorf("proc: %s did not listen on %s: %s", cmd.Path, addr, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Output is what the process has written so far.
func (p *Proc) Output() string { return p.out.String() }

// Stop sends sig (each server's own way to stop: SIGTERM for haproxy,
// SIGINT for nginx and Caddy), kills the process if it has not exited 5 s
// later, and waits for it. It is safe to call more than once.
func (p *Proc) Stop(sig os.Signal) {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
