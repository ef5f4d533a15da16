// Package haproxy runs a master-worker haproxy process (Debian's package)
// on loopback for the project's harnesses: the chaos run's HTTP/2 proxy in
// front of the provider and the cluster harness's load balancer in front
// of the Temporal frontends. Reload is haproxy's graceful reload: new
// workers take new connections while old ones drain.
package haproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// ErrUnavailable is returned (wrapped) when the haproxy binary is missing.
var ErrUnavailable = errors.New("haproxy: binary not found (Debian: apt-get install haproxy)")

// Proxy is a running haproxy.
type Proxy struct {
	cmd *exec.Cmd
	// Addr is the host:port its one frontend listens on.
	Addr string
}

// FreeAddr picks a free loopback host:port for a frontend.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("haproxy: pick a port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Start writes conf to dir/name.cfg and runs haproxy on it, returning once
// addr (the frontend conf binds) accepts connections. conf must bind addr.
func Start(ctx context.Context, bin, dir, name, addr, conf string) (*Proxy, error) {
	if _, err := exec.LookPath(bin); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	cfg := filepath.Join(dir, name+".cfg")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("haproxy: %w", err)
	}
	cmd := exec.CommandContext(ctx, bin, "-W", "-f", cfg)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	// A harness killed without its clean-up must not leave haproxy behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("haproxy: start: %w", err)
	}
	p := &Proxy{cmd: cmd, Addr: addr}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return p, nil
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("haproxy: did not listen on %s within 10s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Reload asks the master for a graceful reload.
func (p *Proxy) Reload() error { return p.cmd.Process.Signal(syscall.SIGUSR2) }

// Stop stops haproxy (SIGTERM, then SIGKILL after 5s) and reaps it. It is
// safe to call more than once.
func (p *Proxy) Stop() {
	if p == nil || p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}
