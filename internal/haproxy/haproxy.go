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
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/durallm/durallm/internal/proc"
)

// ErrUnavailable is returned (wrapped) when the haproxy binary is missing.
var ErrUnavailable = errors.New("haproxy: binary not found (Debian: apt-get install haproxy)")

// Proxy is a running haproxy.
type Proxy struct {
	p *proc.Proc
	// Addr is the host:port its one frontend listens on.
	Addr string
}

// FreeAddr picks a free loopback host:port for a frontend.
func FreeAddr() (string, error) { return proc.FreeAddr() }

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
	p, err := proc.Start(ctx, exec.CommandContext(ctx, bin, "-W", "-f", cfg), addr)
	if err != nil {
		return nil, fmt.Errorf("haproxy: %w", err)
	}
	return &Proxy{p: p, Addr: addr}, nil
}

// Reload asks the master for a graceful reload.
func (p *Proxy) Reload() error { return p.p.Signal(syscall.SIGUSR2) }

// Stop stops haproxy (SIGTERM, then SIGKILL after 5s) and reaps it. It is
// safe to call more than once.
func (p *Proxy) Stop() {
	if p == nil {
		return
	}
	p.p.Stop(syscall.SIGTERM)
}
