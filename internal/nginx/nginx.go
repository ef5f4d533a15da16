// Package nginx runs an nginx (Debian's nginx-light) in the foreground on
// loopback for the project's tests: an HTTP/1.1 TLS front for the
// HTTP/1.1 end-to-end test, an HTTP/2 front for durallm check-path's.
package nginx

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

// ErrUnavailable is returned (wrapped) when the nginx binary is missing.
var ErrUnavailable = errors.New("nginx: binary not found (Debian: apt-get install nginx-light)")

// Proxy is a running nginx.
type Proxy struct {
	cmd  *exec.Cmd
	done chan struct{}
	// Addr is the host:port it was started for.
	Addr string
}

// Start runs nginx in the foreground, as one process that needs no user
// switch, with its pid, logs and temporary files in dir and http as the
// body of its http block (upstreams and servers; access logs off), and
// returns once addr, which a server in http must listen on, accepts
// connections (haproxy.FreeAddr picks a free one).
func Start(ctx context.Context, dir, addr, http string) (*Proxy, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
%[2]s
}
`, dir, http)
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("nginx: %w", err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", cfg)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	// A test killed without its clean-up must not leave nginx behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("nginx: start: %w", err)
	}
	p := &Proxy{cmd: cmd, done: make(chan struct{}), Addr: addr}
	go func() { _ = cmd.Wait(); close(p.done) }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.done:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			return nil, fmt.Errorf("nginx exited: %s", log)
		case <-ctx.Done():
			p.Stop()
			return nil, fmt.Errorf("nginx did not listen on %s", addr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop stops nginx (SIGINT, then SIGKILL after 5s) and waits for it.
func (p *Proxy) Stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
