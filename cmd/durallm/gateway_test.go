package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

func writeTemp(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func tokensFileFor(t *testing.T, token string) string {
	s := sha256.Sum256([]byte(token))
	return writeTemp(t, "tokens.yaml", "tokens:\n  - id: app\n    sha256: "+hex.EncodeToString(s[:])+"\n")
}

// What 'gateway' refuses before it connects anywhere: each a usage error
// (exit 2) that says what to do.
func TestGatewayCommandRefusals(t *testing.T) {
	t.Setenv("DURALLM_ROUTES", "")
	t.Setenv("DURALLM_GATEWAY_CONFIG", "")
	t.Setenv("DURALLM_GATEWAY_TOKENS", "")
	routes := routesFile(t)
	models := writeTemp(t, "models.yaml", "models:\n  - name: m\n    routes: [p]\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a worker needs routes", nil, "--routes"},
		{"no worker needs a config", []string{"--worker=false"}, "--worker=false needs --config"},
		{"beyond loopback without tokens", []string{"--routes", routes, "--addr", "0.0.0.0:9093"}, "not a loopback address"},
		{"a broken tokens file", []string{"--routes", routes, "--tokens", writeTemp(t, "t.yaml", "tokens:\n  - id: a\n    sha256: nothex\n")}, "sha256"},
		{"a broken config", []string{"--routes", routes, "--config", writeTemp(t, "c.yaml", "models:\n  - name: m\n")}, "routes: empty"},
		{"a negative budget", []string{"--routes", routes, "--tokens", writeTemp(t, "t.yaml", "tokens:\n  - id: a\n    sha256: "+strings.Repeat("ab", 32)+"\n    budget: {cost: -5, period: day}\n")}, "budget.cost: negative"},
		{"a budget of zero", []string{"--routes", routes, "--tokens", writeTemp(t, "t.yaml", "tokens:\n  - id: a\n    sha256: "+strings.Repeat("ab", 32)+"\n    budget: {tokens: 0, period: day}\n")}, "neither tokens nor cost"},
		{"a budget without a period", []string{"--routes", routes, "--tokens", writeTemp(t, "t.yaml", "tokens:\n  - id: a\n    sha256: "+strings.Repeat("ab", 32)+"\n    budget: {tokens: 1000}\n")}, "budget.period"},
		{"a short secret", []string{"--worker=false", "--config", models, "--secret-file", writeTemp(t, "s", "short\n")}, "at least 32 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := runGateway(tc.args, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q: want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}

// 'durallm gateway' with a worker in its process, against an embedded
// server and the providertest provider: it prints its URL, answers with
// a token, and refuses without one.
func TestGatewayCommandServes(t *testing.T) {
	dir := t.TempDir()
	port, p := serverAndProvider(t, dir)
	p.SetDefault(providertest.Answer("from the command"))
	metrics := "127.0.0.1:" + strconv.Itoa(freeLoopbackPort(t))
	routes := writeTemp(t, "routes.yaml", "routes:\n  - name: local\n    kind: openai\n    base_url: "+p.HTTP1URL()+"/v1\n    model: m\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gatewayContext = func() context.Context { return ctx }
	t.Cleanup(func() { gatewayContext = context.Background })
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- dispatch([]string{"gateway", "--address", "127.0.0.1:" + strconv.Itoa(port), "--routes", routes, "--addr", "127.0.0.1:0",
			"--tokens", tokensFileFor(t, "app-token"), "--secret-file", filepath.Join(dir, "secret"), "--metrics-addr", metrics,
			"--journal-dir", filepath.Join(dir, "journal"), "--result-dir", filepath.Join(dir, "results")}, &stdout, &stderr)
	}()
	var base string
	eventually(t, "the gateway's URL", func() bool {
		select {
		case code := <-done:
			t.Fatalf("gateway exited %d: %s", code, stderr.String())
		default:
		}
		m := regexp.MustCompile(`OpenAI-compatible API at (http://\S+/v1) \(models: local\)`).FindStringSubmatch(stdout.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	})
	if !strings.Contains(stdout.String(), "made a new fingerprint secret") {
		t.Errorf("it did not say it made the secret: %s", stdout.String())
	}
	post := func(token string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/chat/completions", strings.NewReader(`{"model":"local","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := post("app-token"); resp.StatusCode != 200 || !strings.Contains(body, "from the command") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if resp, _ := post("wrong"); resp.StatusCode != 401 {
		t.Fatalf("a wrong token: %d", resp.StatusCode)
	}
	body, err := providertest.Scrape("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if got := providertest.MetricSum(body, "durallm_gateway_requests_total", `endpoint="/v1/chat/completions"`); got != 2 {
		t.Errorf("durallm_gateway_requests_total = %v, want 2", got)
	}
	if got := providertest.MetricSum(body, "durallm_attempts_total"); got != 1 {
		t.Errorf("the in-process worker's durallm_attempts_total = %v, want 1", got)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("gateway exited %d: %s", code, stderr.String())
	}
}

// 'gateway --worker=false' with 'durallm worker' beside it (each with its
// own Temporal client): the gateway holds no route and no key, and streams
// the answer live from the worker's stream endpoint, which the attempt's
// first heartbeat names.
func TestGatewayCommandWithoutAWorkerStreamsFromTheWorker(t *testing.T) {
	dir := t.TempDir()
	port, p := serverAndProvider(t, dir)
	gate := make(chan struct{})
	p.Push(providertest.Answer("first and the rest").MidStreamWaitFor(gate))
	// h2c: the provider holds a stream mid-way over HTTP/2 only.
	routes := writeTemp(t, "routes.yaml", "routes:\n  - name: local\n    kind: openai\n    base_url: "+p.H2CURL()+"/v1\n    model: m\n    http_version: \"2\"\n    capabilities: {streaming: true}\n")
	models := writeTemp(t, "models.yaml", "models:\n  - name: chat\n    routes: [local]\n")
	address := "127.0.0.1:" + strconv.Itoa(port)

	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	workerContext = func() context.Context { return wctx }
	t.Cleanup(func() { workerContext = context.Background })
	var wout, werr syncbuf.Buffer
	wdone := make(chan int, 1)
	go func() {
		wdone <- dispatch([]string{"worker", "--address", address, "--routes", routes, "--metrics-addr", "", "--stream-addr", "127.0.0.1:0",
			"--journal-dir", filepath.Join(dir, "journal"), "--result-dir", filepath.Join(dir, "results")}, &wout, &werr)
	}()
	gctx, gcancel := context.WithCancel(context.Background())
	defer gcancel()
	gatewayContext = func() context.Context { return gctx }
	t.Cleanup(func() { gatewayContext = context.Background })
	var gout, gerr syncbuf.Buffer
	gdone := make(chan int, 1)
	go func() {
		gdone <- dispatch([]string{"gateway", "--worker=false", "--config", models, "--address", address, "--addr", "127.0.0.1:0",
			"--secret-file", filepath.Join(dir, "secret"), "--metrics-addr", "", "--result-dir", filepath.Join(dir, "results")}, &gout, &gerr)
	}()
	var base string
	eventually(t, "the gateway's URL and the worker", func() bool {
		m := regexp.MustCompile(`API at (http://\S+/v1)`).FindStringSubmatch(gout.String())
		if m != nil {
			base = m[1]
		}
		return m != nil && strings.Contains(werr.String(), "durallm worker started")
	})
	req, _ := http.NewRequest(http.MethodPost, base+"/chat/completions", strings.NewReader(`{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	buf := make([]byte, 4096)
	var got strings.Builder
	for !strings.Contains(got.String(), `"content":"first"`) {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		if err != nil && !strings.Contains(got.String(), `"content":"first"`) {
			t.Fatalf("the first chunk never came while the provider held the rest: %v\n%s\ngateway: %s", err, got.String(), gerr.String())
		}
	}
	if strings.Contains(got.String(), " the") {
		t.Fatalf("the rest came before the provider sent it:\n%s", got.String())
	}
	close(gate)
	rest, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(rest), " the") || !strings.HasSuffix(strings.TrimSpace(string(rest)), "data: [DONE]") {
		t.Fatalf("the rest of the stream:\n%s\nbefore:\n%s", rest, got.String())
	}
	gcancel()
	wcancel()
	if code := <-gdone; code != exitOK {
		t.Fatalf("gateway exited %d: %s", code, gerr.String())
	}
	if code := <-wdone; code != exitOK {
		t.Fatalf("worker exited %d: %s", code, werr.String())
	}
}

// serverAndProvider starts an embedded Temporal server (its frontend's
// port) and the providertest provider, both stopped when the test ends.
func serverAndProvider(t *testing.T, dir string) (int, *providertest.Provider) {
	t.Helper()
	port := freeLoopbackPort(t)
	srv, err := devserver.Start(context.Background(), devserver.Options{
		DataDir: filepath.Join(dir, "temporal"), FrontendPort: port, DisableUI: true,
		SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return port, p
}
