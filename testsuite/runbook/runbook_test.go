package runbook_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/testproc"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/testsuite/runbook"
)

func newProvider(t *testing.T) *providertest.Provider {
	t.Helper()
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func results(t *testing.T, rep runbook.Report) map[string]runbook.Result {
	t.Helper()
	if len(rep.Results) != len(runbook.Cases) {
		t.Fatalf("%d results for %d cases", len(rep.Results), len(runbook.Cases))
	}
	out := map[string]runbook.Result{}
	for _, r := range rep.Results {
		if r.Err != nil {
			t.Fatalf("%s: %v", r.Case.Name, r.Err)
		}
		out[r.Case.Name] = r
	}
	return out
}

// Straight to the provider, every case holds: the suite checks what the
// runbook says.
func TestEveryCaseHoldsDirectly(t *testing.T) {
	p := newProvider(t)
	for _, tr := range []struct {
		name string
		base string
		h2c  bool
	}{{"HTTP/2 over TLS", p.URL(), false}, {"cleartext HTTP/2", p.H2CURL(), true}} {
		t.Run(tr.name, func(t *testing.T) {
			rep, err := runbook.Run(context.Background(), runbook.Setup{Provider: p, Route: routes.Route{BaseURL: tr.base + "/v1"}, TLS: p.ClientTLSConfig(), AllowH2C: tr.h2c})
			if err != nil {
				t.Fatal(err)
			}
			for name, r := range results(t, rep) {
				if !r.Held || r.Unsafe || r.Preserved == "" || r.Hid != "" {
					t.Errorf("%s: %+v", name, r)
				}
			}
			if rep.Held() != len(runbook.Cases) || rep.Unsafe() != 0 {
				t.Fatalf("held %d, unsafe %d", rep.Held(), rep.Unsafe())
			}
		})
	}
}

// An HTTP/2 front that speaks HTTP/1.1 to the provider, as most reverse
// proxies do (here Go's own, with no keep-alive upstream so that it
// never re-sends a request itself): the GOAWAYs, the close and the
// REFUSED_STREAM reach it as an upstream failure and durallm as a 502,
// which it retries. Where the provider had run the request, it runs
// twice; the 421 passes through and holds.
func TestAProxyThatAnswers502HidesTheProofAndRunsRequestsTwice(t *testing.T) {
	p := newProvider(t)
	up, _ := url.Parse(p.HTTP1URL())
	proxy := httputil.NewSingleHostReverseProxy(up)
	proxy.Transport = &http.Transport{DisableKeepAlives: true}
	proxy.ErrorLog = log.New(io.Discard, "", 0)
	ts := httptest.NewUnstartedServer(proxy)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	defer ts.Close()
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())

	rep, err := runbook.Run(context.Background(), runbook.Setup{Provider: p, Route: routes.Route{BaseURL: ts.URL + "/v1"}, TLS: &tls.Config{RootCAs: roots}})
	if err != nil {
		t.Fatal(err)
	}
	got := results(t, rep)
	for _, w := range []struct {
		name     string
		held     bool
		unsafe   bool
		executed int
		class    evidence.Class
	}{
		{"goaway_above", false, false, 1, evidence.UpstreamError},
		{"goaway_at_boundary", false, true, 2, evidence.UpstreamError},
		{"misdirected", true, false, 1, evidence.Misdirected},
		{"bare_close", false, true, 2, evidence.UpstreamError},
		{"refused_stream", false, false, 1, evidence.UpstreamError},
	} {
		r := got[w.name]
		if r.Held != w.held || r.Unsafe != w.unsafe || r.Executed != w.executed || r.Class != w.class {
			t.Errorf("%s: held %v unsafe %v executed %d class %s; want %v %v %d %s (%+v)", w.name, r.Held, r.Unsafe, r.Executed, r.Class, w.held, w.unsafe, w.executed, w.class, r)
		}
		if w.held != (r.Hid == "") || r.Evidence.Status == 0 {
			t.Errorf("%s: preserved %q hid %q", w.name, r.Preserved, r.Hid)
		}
	}
}

// A route marked intermediary does not take REFUSED_STREAM for proof:
// the case holds when durallm waits for a verdict instead.
func TestAnIntermediaryRouteWaitsOnRefusedStream(t *testing.T) {
	p := newProvider(t)
	rep, err := runbook.Run(context.Background(), runbook.Setup{Provider: p, Route: routes.Route{BaseURL: p.URL() + "/v1", Intermediary: true}, TLS: p.ClientTLSConfig()})
	if err != nil {
		t.Fatal(err)
	}
	r := results(t, rep)["refused_stream"]
	if !r.Held || r.Class != evidence.Ambiguous || r.Reason != "rst_refused_stream_via_intermediary" || r.Preserved == "" {
		t.Fatalf("%+v", r)
	}
}

func TestAnUnusableSetupIsAnError(t *testing.T) {
	if _, err := runbook.Run(context.Background(), runbook.Setup{}); err == nil {
		t.Fatal("no provider accepted")
	}
	p := newProvider(t)
	if _, err := runbook.Run(context.Background(), runbook.Setup{Provider: p, Route: routes.Route{BaseURL: "ftp://x"}}); err == nil {
		t.Fatal("a bad base URL accepted")
	}
}

// On a busy machine the first case runs like the others. The SDK hashes
// the process's binary for its build id inside the first workflow task
// that schedules an activity; on a loaded CPU that outlasts the test
// environment's default deadlock detection (1 s), which failed the case.
func TestRunOnABusyMachineRunsItsFirstCase(t *testing.T) {
	prev := (&workflow.Info{}).GetBinaryChecksum()
	t.Cleanup(func() { worker.SetBinaryChecksum(prev) })
	worker.SetBinaryChecksum("") // hashed again at its next use, as in a new process
	p := newProvider(t)
	// Busy until the first request reaches the provider: the hash is
	// done by then.
	idle := testproc.Busy(t, 15)
	go func() {
		for len(p.Received()) == 0 && t.Context().Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		idle()
	}()
	rep, err := runbook.Run(context.Background(), runbook.Setup{Provider: p, Route: routes.Route{BaseURL: p.URL() + "/v1"}, TLS: p.ClientTLSConfig()})
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range results(t, rep) {
		if !r.Held {
			t.Errorf("%s: %+v", name, r)
		}
	}
}
