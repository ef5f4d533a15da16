//go:build !nodev

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/durallm/durallm/internal/haproxy"
	"github.com/durallm/durallm/internal/nginx"
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
	for _, s := range []string{"hid:       the GOAWAY; durallm saw HTTP 502", "preserved: the 421 (HTTP 421)", "the provider ran the request 2 times", "1 of 5 cases held; 2 unsafe."} {
		if !strings.Contains(out, s) {
			t.Errorf("the report does not say %q:\n%s", s, out)
		}
	}
	t.Logf("check-path through nginx:\n%s", out)
}

func TestCheckPathNeedsVia(t *testing.T) {
	if code, _ := checkPath(t); code != exitUsage {
		t.Fatalf("exit %d", code)
	}
	if code, _ := checkPath(t, "--via", "ftp://x"); code != exitUsage {
		t.Fatalf("exit %d for a bad --via", code)
	}
}
