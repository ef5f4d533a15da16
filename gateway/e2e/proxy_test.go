package e2e_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
)

// tcpProxy forwards TCP connections to a target both ways. While held,
// what the target answers is kept back (what the client sends still goes
// through); cut closes every connection open.
type tcpProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	held  bool
	free  chan struct{} // closed while not held
	conns []net.Conn
	wg    sync.WaitGroup
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, free: make(chan struct{})}
	close(p.free)
	t.Cleanup(func() { ln.Close(); p.release(); p.cut(); p.wg.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer p.wg.Done(); p.answers(c, up) }()
		}
	}()
	return p
}

// answers copies the target's bytes to the client, waiting while held.
func (p *tcpProxy) answers(c, up net.Conn) {
	defer c.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			p.mu.Lock()
			free := p.free
			p.mu.Unlock()
			<-free
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *tcpProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		p.held, p.free = true, make(chan struct{})
	}
}

func (p *tcpProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		p.held = false
		close(p.free)
	}
}

// cut closes every connection open.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// client is an HTTP client whose every connection goes through the proxy.
func (p *tcpProxy) client() *http.Client {
	addr := p.ln.Addr().String()
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}}}
}
