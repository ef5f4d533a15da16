package e2e_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/gateway"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/worker"
)

// benchGateway is durallm's gateway over a bench stack, on loopback.
type benchGateway struct {
	base string // the API's root, with /v1
	hc   *http.Client
}

// newBenchGateway serves the gateway on c (the route "r" as the model
// "r"), reading streams from hub when set and from the workers' stream
// endpoints when remote.
func newBenchGateway(b *testing.B, c *durallm.Client, hub *activities.Streams, remote bool) *benchGateway {
	b.Helper()
	o := gateway.Options{Client: c, Models: gateway.ModelsFromRoutes([]string{"r"}), Secret: []byte(strings.Repeat("s", 32)),
		Streams: hub, Logger: slog.New(slog.DiscardHandler)}
	if remote {
		o.Remote = &gateway.RemoteStreams{}
	}
	g, err := gateway.New(o)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(g)
	b.Cleanup(srv.Close)
	return &benchGateway{base: srv.URL + "/v1", hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
}

// elsewhereClient is a durallm client on a Temporal client of its own,
// for a gateway whose worker is in another process (no shared client, no
// eager start, no shared hub).
func elsewhereClient(b *testing.B, st *serverStack, taskQueue string) *durallm.Client {
	b.Helper()
	co := st.srv.ClientOptions()
	co.Logger = sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))
	tc, err := client.Dial(co)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(tc.Close)
	return durallm.NewClient(tc, taskQueue)
}

// The APIs a benchmark sends the same request through: chat completions,
// OpenAI's Responses and Anthropic's Messages. first is how a streamed answer's first
// content event starts, last how its end does.
type benchAPI struct {
	path, json, stream string
	first, last        string
}

var (
	chatAPI = benchAPI{path: "/chat/completions",
		json:   `{"model":"r","messages":[{"role":"user","content":"hi"}]}`,
		stream: `{"model":"r","stream":true,"messages":[{"role":"user","content":"hello"}]}`,
		first:  `"content":`, last: "data: [DONE]"}
	responsesAPI = benchAPI{path: "/responses",
		json:   `{"model":"r","input":"hi"}`,
		stream: `{"model":"r","stream":true,"input":"hello"}`,
		first:  `"type":"response.output_text.delta"`, last: "event: response.completed"}
	messagesAPI = benchAPI{path: "/messages",
		json:   `{"model":"r","max_tokens":256,"messages":[{"role":"user","content":"hi"}]}`,
		stream: `{"model":"r","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"hello"}]}`,
		first:  `"type":"text_delta"`, last: "event: message_stop"}
)

// json sends one non-streamed request and reads its answer; it returns the
// action id.
func (g *benchGateway) json(ctx context.Context) (string, error) { return g.jsonOf(ctx, chatAPI) }

func (g *benchGateway) jsonOf(ctx context.Context, api benchAPI) (string, error) {
	resp, err := g.post(ctx, api.path, api.json)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		return "", fmt.Errorf("gateway: %d %.200s %v", resp.StatusCode, body, err)
	}
	return resp.Header.Get("X-Durallm-Action-Id"), nil
}

// ttft sends one streamed request and returns the time to its first
// content chunk, reading the stream to its end.
func (g *benchGateway) ttft(ctx context.Context) (time.Duration, error) {
	return g.ttftOf(ctx, chatAPI)
}

func (g *benchGateway) ttftOf(ctx context.Context, api benchAPI) (time.Duration, error) {
	t0 := time.Now()
	resp, err := g.post(ctx, api.path, api.stream)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("gateway: %d %.200s", resp.StatusCode, b)
	}
	var first time.Duration
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if first == 0 && strings.HasPrefix(line, "data: ") && strings.Contains(line, api.first) {
			first = time.Since(t0)
		}
		if line == api.last {
			if first == 0 {
				return 0, fmt.Errorf("gateway: a stream without content")
			}
			// Read the end's data too: the request is done when its
			// stream is.
			_, _ = io.Copy(io.Discard, resp.Body)
			return first, nil
		}
	}
	return 0, fmt.Errorf("gateway: the stream ended without %q (%v)", api.last, sc.Err())
}

func (g *benchGateway) post(ctx context.Context, path, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return g.hc.Do(req)
}

// startWorkerProcess runs a durallm worker in another process (this test
// binary, as TestHelperBenchWorker) on taskQueue, against st's server and
// provider, its stream endpoint on loopback: the worker of a gateway run
// with --worker=false. It stops when the benchmark ends.
func startWorkerProcess(b *testing.B, st *serverStack, taskQueue string) {
	b.Helper()
	certPEM, _, err := st.p.CertificatePEM()
	if err != nil {
		b.Fatal(err)
	}
	ca := filepath.Join(b.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, certPEM, 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBenchWorker$")
	cmd.Env = append(os.Environ(), "DURALLM_BENCH_WORKER=1", "DURALLM_BENCH_TEMPORAL="+st.srv.FrontendHostPort(),
		"DURALLM_BENCH_QUEUE="+taskQueue, "DURALLM_BENCH_PROVIDER="+st.p.URL(), "DURALLM_BENCH_CA="+ca)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "durallm-bench-worker ready") {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return
		}
	}
	b.Fatalf("the worker process did not start: %v", sc.Err())
}

// TestHelperBenchWorker is the worker process of startWorkerProcess. It
// does nothing in a normal run.
func TestHelperBenchWorker(t *testing.T) {
	if os.Getenv("DURALLM_BENCH_WORKER") != "1" {
		t.Skip("the worker process of the gateway benchmarks")
	}
	pem, err := os.ReadFile(os.Getenv("DURALLM_BENCH_CA"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tc, err := client.Dial(client.Options{HostPort: os.Getenv("DURALLM_BENCH_TEMPORAL"), Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
		ConnectionOptions: client.ConnectionOptions{GrpcCompression: &client.GrpcCompressionNone{}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	r := routes.Route{Name: "r", Kind: routes.KindOpenAI, BaseURL: os.Getenv("DURALLM_BENCH_PROVIDER") + "/v1", Model: "m", Capabilities: providers.Capabilities{Streaming: true}}
	w, err := worker.New(tc, worker.Options{TaskQueue: os.Getenv("DURALLM_BENCH_QUEUE"), Config: routes.Config{Routes: []routes.Route{r}},
		TLS: &tls.Config{RootCAs: pool}, SearchAttributes: true, Logger: slog.New(slog.DiscardHandler),
		WorkflowPollers: 8, ActivityPollers: 8, StreamAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	fmt.Println("durallm-bench-worker ready", w.StreamURL())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the benchmark closes it
}
