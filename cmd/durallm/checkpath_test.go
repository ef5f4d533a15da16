//go:build !nodev

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/internal/haproxy"
	"github.com/durallm/durallm/internal/nginx"
	"github.com/durallm/durallm/internal/testproc"
	"github.com/durallm/durallm/testsuite/providertest"
)

// providerFlags picks free loopback addresses for check-path's provider
// and returns them as flags, with the HTTP/2 TLS and HTTP/1.1 ones.
func providerFlags(t *testing.T) (flags []string, h2TLS, h1 string) {
	t.Helper()
	var addrs []string
	for range 4 {
		a, err := haproxy.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	return []string{"--provider-tls-addr", addrs[0], "--provider-h2c-addr", addrs[1], "--provider-http1-addr", addrs[2], "--provider-http1-tls-addr", addrs[3]}, addrs[0], addrs[2]
}

func checkPath(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := dispatch(append([]string{"check-path"}, args...), &out, &errOut)
	if errOut.Len() > 0 {
		t.Logf("stderr: %s", errOut.String())
	}
	return code, out.String()
}

// caseLine finds a case's verdict in check-path's report.
func caseLine(t *testing.T, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `\s.*?\s{2,}(held|did not hold|DID NOT HOLD, UNSAFE|NOT RUN)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no verdict for %s in:\n%s", name, out)
	}
	return m[1]
}

// Straight to the provider's HTTP/2 listener, every case holds.
func TestCheckPathDirectlyEveryCaseHolds(t *testing.T) {
	flags, h2TLS, _ := providerFlags(t)
	code, out := checkPath(t, append(flags, "--via", "https://"+h2TLS+"/v1")...)
	if code != exitOK || !strings.Contains(out, "5 of 5 cases held.") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, name := range []string{"goaway_above", "goaway_at_boundary", "misdirected", "bare_close", "refused_stream"} {
		if v := caseLine(t, out, name); v != "held" {
			t.Errorf("%s: %s", name, v)
		}
	}
}

// nginx as an HTTP/2 front, proxying to the provider over HTTP/1.1 (the
// only way nginx proxies a plain HTTP upstream): the provider's GOAWAYs,
// its bare close and its REFUSED_STREAM reach durallm as nginx's 502, so
// the GOAWAY cases and the close do not hold, and where the provider had
// run the request durallm's retry runs it twice. The 421 passes through.
func TestCheckPathThroughNginxNamesWhatItHid(t *testing.T) {
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Skip("nginx not installed (apt-get install nginx-light)")
	}
	flags, _, h1 := providerFlags(t)
	dir := t.TempDir()
	// nginx needs a certificate before check-path's provider exists: a
	// provider of its own mints one (loopback names).
	minter, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := minter.CertificatePEM()
	minter.Close()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"cert.pem": cert, "key.pem": key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := haproxy.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	n, err := nginx.Start(context.Background(), dir, addr, fmt.Sprintf(`
  server {
    listen %[3]s ssl http2;
    ssl_certificate %[1]s/cert.pem;
    ssl_certificate_key %[1]s/key.pem;
    location / {
      proxy_pass http://%[2]s;
      proxy_http_version 1.1;
      proxy_buffering off;
    }
  }`, dir, h1, addr))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()

	code, out := checkPath(t, append(flags, "--via", "https://"+addr+"/v1", "--ca-file", filepath.Join(dir, "cert.pem"))...)
	if code != exitFailed {
		t.Fatalf("exit %d, want %d:\n%s", code, exitFailed, out)
	}
	for name, want := range map[string]string{
		"goaway_above":       "did not hold",
		"goaway_at_boundary": "DID NOT HOLD, UNSAFE",
		"misdirected":        "held",
		"bare_close":         "DID NOT HOLD, UNSAFE",
		"refused_stream":     "did not hold",
	} {
		if got := caseLine(t, out, name); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	for _, s := range []string{"hid:       the GOAWAY; durallm saw HTTP 502", "preserved: the 421 (HTTP 421)", "the provider ran the request 2 times", "1 of 5 cases held; 2 unsafe.",
		// nginx's own 502 is no proof: marking the route intermediary
		// would change what durallm concludes.
		"(run with --intermediary)"} {
		if !strings.Contains(out, s) {
			t.Errorf("the report does not say %q:\n%s", s, out)
		}
	}
	t.Logf("check-path through nginx:\n%s", out)
}

// On a busy machine check-path runs its first case like the others. The
// SDK hashed the 250 MB binary for its build id inside the first case's
// first workflow task, which on a loaded CPU outlasted the deadlock
// detection and left the case NOT RUN. The attempt timeout is short here,
// so the runbook's deadlock timeout (an attempt's) cannot absorb the
// hash: check-path must not hash the binary at all.
func TestCheckPathRunsItsFirstCaseOnABusyMachine(t *testing.T) {
	prev := (&workflow.Info{}).GetBinaryChecksum()
	t.Cleanup(func() { worker.SetBinaryChecksum(prev) })
	worker.SetBinaryChecksum("") // hashed again at its next use, as in a new process
	flags, h2TLS, _ := providerFlags(t)
	// Busy until the first attempt connects: by then its workflow task
	// has scheduled it. The path is a plain TCP relay, which tells.
	idle := testproc.Busy(t, 15)
	relay := tcpRelay(t, h2TLS, idle)
	code, out := checkPath(t, append(flags, "--via", "https://"+relay+"/v1", "--attempt-timeout", "2s")...)
	if code != exitOK || !strings.Contains(out, "5 of 5 cases held.") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// Over HTTP/1.1, which has no GOAWAY and no REFUSED_STREAM, the cases the
// provider refused that way reach durallm as a closed connection, which
// proves nothing, so the action waits for a verdict and nothing is sent
// again. check-path says so; it never explains a retry that did not
// happen, nor suggests --intermediary, which changes nothing there.
func TestCheckPathOverHTTP1SaysNothingOfARetryThatDidNotHappen(t *testing.T) {
	flags, _, h1 := providerFlags(t)
	code, out := checkPath(t, append(flags, "--via", "http://"+h1+"/v1", "--http-version", "1.1")...)
	if code != exitFailed {
		t.Fatalf("exit %d, want %d:\n%s", code, exitFailed, out)
	}
	for _, s := range []string{"executed once all the same", "--intermediary"} {
		if strings.Contains(out, s) {
			t.Errorf("the report says %q:\n%s", s, out)
		}
	}
	for _, name := range []string{"goaway_above", "refused_stream"} {
		if v := caseLine(t, out, name); v != "did not hold" {
			t.Errorf("%s: %s", name, v)
		}
		block := out[strings.Index(out, "\n"+name+" "):]
		block = block[:strings.Index(block[1:], "\n\n")+1]
		if !strings.Contains(block, "so:        not retried:") {
			t.Errorf("%s does not say it was not retried:\n%s", name, block)
		}
	}
	if !strings.Contains(out, "HTTP/1.1 has no GOAWAY and no REFUSED_STREAM") {
		t.Errorf("the report does not say what HTTP/1.1 cannot carry:\n%s", out)
	}
}

// tcpRelay relays each connection to its address to target, and calls
// first when the first one arrives; it returns its address.
func tcpRelay(t *testing.T, target string, first func()) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var once sync.Once
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			once.Do(first)
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return l.Addr().String()
}

func TestCheckPathNeedsVia(t *testing.T) {
	if code, _ := checkPath(t); code != exitUsage {
		t.Fatalf("exit %d", code)
	}
	if code, _ := checkPath(t, "--via", "ftp://x"); code != exitUsage {
		t.Fatalf("exit %d for a bad --via", code)
	}
}
