//go:build !nodev

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/testsuite/runbook"
	"github.com/durallm/durallm/workflows"
)

// runCheckPath runs the five recovery runbook cases through a proxy path
// to the fault-injecting provider and says, case by case, what the path
// preserved and what it hid.
func runCheckPath(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("check-path", "--via URL [flags]", stderr)
	via := fs.String("via", "", "the route's base_url through the path under test, e.g. https://proxy:443/v1; the path must lead to one of the provider's listeners below (required)")
	tlsAddr := fs.String("provider-tls-addr", "127.0.0.1:8443", "the provider's HTTP/2 TLS listen address (certificate for loopback names only)")
	h2cAddr := fs.String("provider-h2c-addr", "127.0.0.1:8080", "the provider's cleartext HTTP/2 (prior knowledge) listen address")
	h1Addr := fs.String("provider-http1-addr", "127.0.0.1:8081", "the provider's cleartext HTTP/1.1 listen address")
	h1TLSAddr := fs.String("provider-http1-tls-addr", "127.0.0.1:8444", "the provider's HTTP/1.1 TLS listen address")
	caFile := fs.String("ca-file", "", "PEM certificates that sign the path's TLS certificate (default: the system roots, plus the provider's own certificate)")
	insecure := fs.Bool("insecure-skip-verify", false, "do not verify the path's TLS certificate (as a route's insecure_skip_verify)")
	httpVersion := fs.String("http-version", "", "the route's http_version: empty (auto), \"1.1\" or \"2\"")
	intermediary := fs.Bool("intermediary", false, "mark the route intermediary, as a route through a proxy should be: its REFUSED_STREAM is no proof")
	keyEnv := fs.String("api-key-env", "", "an environment variable holding the key the path wants (sent as Authorization: Bearer; the provider ignores it); a --via that is not loopback needs one")
	allowH2C := fs.Bool("allow-h2c", false, "an http:// --via with http_version auto speaks cleartext HTTP/2 (as durallm worker --allow-h2c)")
	timeout := fs.Duration("attempt-timeout", 20*time.Second, "bounds each attempt through the path")
	asJSON := fs.Bool("json", false, "JSON output")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *via == "" {
		fmt.Fprintln(stderr, "durallm check-path: --via is required: the base_url of a route through the path under test")
		return exitUsage
	}
	route := routes.Route{Name: "check-path", Kind: routes.KindOpenAI, BaseURL: *via, Model: "check-path-model", APIKeyEnv: *keyEnv,
		HTTPVersion: *httpVersion, Intermediary: *intermediary, InsecureSkipVerify: *insecure}
	if err := (routes.Config{Routes: []routes.Route{route}}).Validate(); err != nil {
		fmt.Fprintf(stderr, "durallm check-path: the route through the path (--via, --http-version, --api-key-env):\n%v\n", err)
		return exitUsage
	}
	p, err := providertest.NewProvider(providertest.WithListenAddrs(*tlsAddr, *h2cAddr), providertest.WithHTTP1ListenAddrs(*h1Addr, *h1TLSAddr), providertest.WithModel("check-path-model"))
	if err != nil {
		fmt.Fprintf(stderr, "durallm check-path: provider: %v\n", err)
		return exitError
	}
	defer p.Close()
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fmt.Fprintf(stderr, "durallm check-path: --ca-file: %v\n", err)
			return exitUsage
		}
		if !roots.AppendCertsFromPEM(pem) {
			fmt.Fprintf(stderr, "durallm check-path: --ca-file %s: no PEM certificate in it\n", *caFile)
			return exitUsage
		}
	}
	if cert, _, err := p.CertificatePEM(); err == nil {
		roots.AppendCertsFromPEM(cert)
	}

	if !*asJSON {
		fmt.Fprintf(stdout, "durallm check-path: the recovery runbook through %s\n", *via)
		fmt.Fprintf(stdout, "  to the fault-injecting provider: HTTP/2 %s, h2c %s, HTTP/1.1 %s, HTTP/1.1 TLS %s\n\n", p.URL(), p.H2CURL(), p.HTTP1URL(), p.HTTP1TLSURL())
	}
	// The cases run in the SDK's test environment, which names its worker
	// by the binary's checksum unless told one: hashing this 250 MB
	// binary, inside the first case's first workflow task, outlasted the
	// deadlock detection on a busy machine. This process runs no worker
	// of its own that a checksum would tell apart.
	worker.SetBinaryChecksum("durallm-check-path")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := runbook.Run(ctx, runbook.Setup{Provider: p, Route: route, TLS: &tls.Config{RootCAs: roots}, AllowH2C: *allowH2C, Timeout: *timeout})
	if err != nil {
		fmt.Fprintf(stderr, "durallm check-path: %v\n", err)
		return exitError
	}
	if *asJSON {
		if err := writeCheckJSON(stdout, rep); err != nil {
			fmt.Fprintf(stderr, "durallm check-path: %v\n", err)
			return exitError
		}
	} else {
		writeCheck(stdout, rep, *intermediary)
	}
	for _, r := range rep.Results {
		if r.Err != nil {
			return exitError
		}
	}
	if rep.Held() < len(rep.Results) {
		return exitFailed
	}
	return exitOK
}

// writeCheck prints the report, case by case.
func writeCheck(w io.Writer, rep runbook.Report, intermediary bool) {
	for _, r := range rep.Results {
		verdict := "held"
		switch {
		case r.Err != nil:
			verdict = "NOT RUN"
		case r.Unsafe:
			verdict = "DID NOT HOLD, UNSAFE"
		case !r.Held:
			verdict = "did not hold"
		}
		fmt.Fprintf(w, "%-19s %-34s %s\n", r.Case.Name, r.Case.Title, verdict)
		fmt.Fprintf(w, "  provider:  %s\n", r.Case.Fault)
		fmt.Fprintf(w, "  directly:  %s\n", conclusion(r.Case.Class, r.Case.Reason, r.Case.Next, directExecutions(r.Case)))
		if r.Err != nil {
			fmt.Fprintf(w, "  error:     %v\n\n", r.Err)
			continue
		}
		fmt.Fprintf(w, "  via path:  %s\n", conclusion(r.Class, r.Reason, r.Next, r.Executed))
		if r.Preserved != "" {
			fmt.Fprintf(w, "  preserved: %s\n", r.Preserved)
		}
		if r.Hid != "" {
			fmt.Fprintf(w, "  hid:       %s\n", r.Hid)
		}
		if so := consequence(r); so != "" {
			fmt.Fprintf(w, "  so:        %s\n", so)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d of %d cases held", rep.Held(), len(rep.Results))
	if n := rep.Unsafe(); n > 0 {
		fmt.Fprintf(w, "; %d unsafe", n)
	}
	fmt.Fprintln(w, ".")
	if rep.Unsafe() > 0 {
		fmt.Fprintln(w, "Unsafe: through this path durallm sends a request the provider had already run again. A proxy that answers for the")
		fmt.Fprintln(w, "provider (a 502 when its upstream connection ends, a REFUSED_STREAM of its own) hides the evidence durallm decides on:")
		fmt.Fprintln(w, "reach the provider without it, or through a proxy that relays the provider's HTTP/2 frames as they are.")
	}
	if spokeHTTP1(rep) && rep.Held() < len(rep.Results) {
		fmt.Fprintln(w, "durallm spoke HTTP/1.1 through this path. HTTP/1.1 has no GOAWAY and no REFUSED_STREAM: a request the provider refused")
		fmt.Fprintln(w, "that way reaches durallm as a closed connection, which proves nothing, so it waits for a verdict instead of retrying.")
		fmt.Fprintln(w, "Reach the provider over HTTP/2 (through a proxy that relays its frames) for those cases to hold.")
	}
	if !intermediary && intermediaryMatters(rep) {
		fmt.Fprintln(w, "A route through a proxy should say intermediary: true (run with --intermediary): a proxy's REFUSED_STREAM, or its own 502,")
		fmt.Fprintln(w, "is no proof, and here it would change what durallm concludes (docs/recovery.md).")
	}
}

// consequence says what a case's result meant for the request, when that
// is not plain from its verdict: sent twice, taken for unprocessed,
// retried on evidence that proves nothing, or not retried at all.
func consequence(r runbook.Result) string {
	switch {
	case r.Err != nil:
		return ""
	case r.Unsafe && r.Executed > 1:
		return fmt.Sprintf("the provider ran the request %d times: durallm took the path's answer for a retryable failure", r.Executed)
	case r.Unsafe:
		return "durallm took a request the provider ran for one provably not processed"
	case r.Held:
		return ""
	case r.Next == workflows.DecideRetry && r.Executed == 1:
		return "executed once all the same, but on evidence that proves nothing: a request the provider had run would look the same"
	case r.Next == workflows.DecideAwait && r.Case.Next == workflows.DecideRetry && r.Executed == 0:
		return "not retried: nothing durallm saw proves that the provider did not run it, so the action waits for a verdict (the provider never ran it)"
	}
	return ""
}

// spokeHTTP1 reports whether durallm reached the path over HTTP/1.1.
func spokeHTTP1(rep runbook.Report) bool {
	for _, r := range rep.Results {
		if r.Err == nil && r.Evidence.HTTPVersion == evidence.ProtoHTTP11 {
			return true
		}
	}
	return false
}

// intermediaryMatters reports whether marking the route intermediary
// would change what durallm concluded from some case's evidence (a
// REFUSED_STREAM or a 502 the path sent): only then is --intermediary
// worth suggesting.
func intermediaryMatters(rep runbook.Report) bool {
	for _, r := range rep.Results {
		ev := r.Evidence
		if r.Err != nil || ev.Intermediary {
			continue
		}
		ev.Intermediary = true
		if evidence.Classify(ev).Class != r.Class {
			return true
		}
	}
	return false
}

func directExecutions(c runbook.Case) int {
	if c.Next == "await_reconciliation" && !c.Executed {
		return 0
	}
	return 1
}

func conclusion(class evidence.Class, reason, next string, executed int) string {
	times := "once"
	switch executed {
	case 0:
		times = "never"
	case 1:
	default:
		times = fmt.Sprintf("%d times", executed)
	}
	return fmt.Sprintf("%s (%s), then %s; executed %s", class, reason, next, times)
}

// writeCheckJSON writes one object per case.
func writeCheckJSON(w io.Writer, rep runbook.Report) error {
	type result struct {
		Case      string            `json:"case"`
		Title     string            `json:"title"`
		Held      bool              `json:"held"`
		Unsafe    bool              `json:"unsafe"`
		Class     evidence.Class    `json:"class,omitempty"`
		Reason    string            `json:"reason,omitempty"`
		Next      string            `json:"next,omitempty"`
		Executed  int               `json:"executed"`
		Preserved string            `json:"preserved,omitempty"`
		Hid       string            `json:"hid,omitempty"`
		Evidence  evidence.Evidence `json:"evidence"`
		Error     string            `json:"error,omitempty"`
	}
	out := struct {
		Held    int      `json:"held"`
		Unsafe  int      `json:"unsafe"`
		Results []result `json:"results"`
	}{Held: rep.Held(), Unsafe: rep.Unsafe()}
	for _, r := range rep.Results {
		e := ""
		if r.Err != nil {
			e = r.Err.Error()
		}
		out.Results = append(out.Results, result{Case: r.Case.Name, Title: r.Case.Title, Held: r.Held, Unsafe: r.Unsafe, Class: r.Class, Reason: r.Reason, Next: r.Next,
			Executed: r.Executed, Preserved: r.Preserved, Hid: r.Hid, Evidence: r.Evidence, Error: e})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
