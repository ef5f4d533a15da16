// Package nginx runs an nginx (Debian's nginx-light) in the foreground on
// loopback for the project's tests: an HTTP/1.1 TLS front for the
// HTTP/1.1 end-to-end test, an HTTP/2 front for durallm check-path's.
package nginx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/durallm/durallm/internal/proc"
)

// ErrUnavailable is returned (wrapped) when the nginx binary is missing.
var ErrUnavailable = errors.New("nginx: binary not found (Debian: apt-get install nginx-light)")

// Proxy is a running nginx.
type Proxy struct {
	p *proc.Proc
	// Addr is the host:port it was started for.
	Addr string
}

// Start runs nginx in the foreground, as one process that needs no user
// switch, with its pid and temporary files in dir and http as the body of
// its http block (upstreams and servers; access logs off), and returns
// once addr, which a server in http must listen on, accepts connections
// (proc.FreeAddr picks a free one). Its error log goes to the error Start
// returns if it fails.
func Start(ctx context.Context, dir, addr, http string) (*Proxy, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log stderr warn;
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
	p, err := proc.Start(ctx, exec.Command(bin, "-p", dir, "-c", cfg), addr)
	if err != nil {
		return nil, fmt.Errorf("nginx: %w", err)
	}
	return &Proxy{p: p, Addr: addr}, nil
}

// Stop stops nginx (SIGINT, then SIGKILL after 5s) and waits for it.
func (n *Proxy) Stop() { n.p.Stop(os.Interrupt) }
