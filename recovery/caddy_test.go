package recovery_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durallm/durallm/internal/testproc"
	"github.com/durallm/durallm/testsuite/providertest"
)

// The same as TestAnRSTForAStreamTheGoAwayRefusedIsNeverSent, through a
// real Caddy 2.6 (Debian's, built with Go 1.19) reloaded while an answer
// is in flight: its GOAWAY crosses the client's next request, and the
// RST_STREAM x/net sends for that stream made it close the connection
// with the answer below the boundary, which the provider had executed.
func TestAnRSTForAStreamTheGoAwayRefusedIsNeverSentThroughCaddy(t *testing.T) {
	bin, err := exec.LookPath("caddy")
	if err != nil {
		t.Skip("caddy not installed (apt-get install caddy)")
	}
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	caddy, reload := startCaddy(t, bin, p, strings.TrimPrefix(p.HTTP1URL(), "http://"))
	crossTheGoAway(t, p, caddy, reload)
}

// startCaddy runs caddy with an HTTP/2 TLS listener (the provider's
// certificate) on a free loopback port that reverse-proxies to upstream,
// until the test ends. It
// returns the listener's address and a function that reloads the config
// through the admin API (a changed response header, so it is a new
// config), as an operator's "caddy reload" does.
func startCaddy(t *testing.T, bin string, p *providertest.Provider, upstream string) (addr string, reload func() error) {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM, err := p.CertificatePEM()
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for name, b := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr, admin := testproc.FreeAddr(t), testproc.FreeAddr(t)
	config := func(gen int) []byte {
		return fmt.Appendf(nil, `{"admin":{"listen":%q},"storage":{"module":"file_system","root":%q},
"apps":{"tls":{"certificates":{"load_files":[{"certificate":%q,"key":%q,"tags":["provider"]}]}},
"http":{"servers":{"s":{"listen":[%q],"automatic_https":{"disable":true},
"tls_connection_policies":[{"certificate_selection":{"any_tag":["provider"]}}],
"routes":[{"handle":[{"handler":"headers","response":{"set":{"X-Config":["%d"]}}},{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
			admin, filepath.Join(dir, "data"), certFile, keyFile, addr, gen, upstream)
	}
	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, config(1), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", cfg)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	testproc.Start(t, cmd, addr)
	gen := 1
	return addr, func() error {
		gen++
		resp, err := http.Post("http://"+admin+"/load", "application/json", bytes.NewReader(config(gen)))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("caddy reload: %s: %s", resp.Status, b)
		}
		return nil
	}
}
