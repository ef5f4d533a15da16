//go:build !nodev

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/examples/agent"
	demonstration "github.com/durallm/durallm/internal/demo"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/testsuite/providertest"
)

// devRun is one 'durallm dev' running in this process.
type devRun struct {
	t    *testing.T
	out  syncbuf.Buffer // read while dev still writes it
	err  bytes.Buffer   // read only once dev has exited
	done chan int
	stop context.CancelFunc
}

func (d *devRun) output() string { return d.out.String() }

// startDev runs 'dev' with args until stop is called.
func startDev(t *testing.T, args ...string) *devRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	devContext = func() context.Context { return ctx }
	t.Cleanup(func() { devContext = context.Background })
	d := &devRun{t: t, done: make(chan int, 1), stop: cancel}
	go func() { d.done <- dispatch(append([]string{"dev"}, args...), &d.out, &d.err) }()
	return d
}

// await waits until the output matches re and returns the submatches.
func (d *devRun) await(re string) []string {
	d.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if m := rx.FindStringSubmatch(d.output()); m != nil {
			return m
		}
		select {
		case code := <-d.done:
			d.t.Fatalf("dev exited %d before printing %q\nstdout:\n%s\nstderr:\n%s", code, re, d.output(), d.err.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	d.t.Fatalf("dev never printed %q:\n%s", re, d.output())
	return nil
}

func (d *devRun) finish() {
	d.t.Helper()
	d.stop()
	if code := <-d.done; code != exitOK {
		d.t.Fatalf("dev exited %d\nstdout:\n%s\nstderr:\n%s", code, d.output(), d.err.String())
	}
}

// TestDevDemonstrationEndToEnd runs 'durallm dev' headless on free ports
// over a fresh data directory: the embedded server, the worker, the demo
// provider and the demonstration. It scrapes /metrics and checks the
// counters match what the demonstration did. Then it restarts 'dev' over
// the same directory, finds the action left awaiting a verdict, reconciles
// it through the CLI and checks it ended reconciled.
func TestDevDemonstrationEndToEnd(t *testing.T) {
	dir := t.TempDir()
	d := startDev(t, "--headless", "--port", "-1", "--data-dir", dir, "--metrics-addr", "127.0.0.1:0", "--stream-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0")
	metrics := d.await(`metrics at (http://\S+/metrics)`)[1]
	waiting := d.await(`(demo-\d+-ambiguous) awaits your verdict`)[1]
	out := d.output()
	for _, c := range demonstration.Cases {
		if !regexp.MustCompile(`\[ok\] demo-\d+-` + c.Name + ` → ` + string(c.Want)).MatchString(out) {
			t.Errorf("demonstration did not show %s ending %s:\n%s", c.Name, c.Want, out)
		}
	}
	if !strings.Contains(out, "fresh connection after GOAWAY last=") {
		t.Errorf("the GOAWAY recovery is not visible in the output:\n%s", out)
	}

	// The counters say what happened: 5 actions, 7 attempts.
	body, err := providertest.Scrape(metrics)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"durallm_attempts_total", []string{`durallm_classification="completed"`}, 3},
		{"durallm_attempts_total", []string{`durallm_classification="refused"`}, 1},
		{"durallm_attempts_total", []string{`durallm_classification="misdirected"`}, 1},
		{"durallm_attempts_total", []string{`durallm_classification="ambiguous"`}, 1},
		{"durallm_attempts_total", []string{`durallm_classification="canceled"`}, 1},
		{"durallm_ambiguous_total", []string{`durallm_reason="goaway_at_or_below_boundary"`}, 1},
		{"durallm_cancellations", []string{`origin="user_stop"`}, 1},
		{"durallm_quarantines_total", nil, 1},
		{"durallm_goaways_total", []string{`http2_error_code="NO_ERROR"`}, 2},
		{"durallm_connections_opened_total", nil, 4}, // the first, then one after each GOAWAY (2) and after the 421
		{"durallm_transport_replays_total", nil, 0},
		{"durallm_sends_after_goaway_total", nil, 0},
		{"durallm_attempts_after_cancel", nil, 0},
		{"gen_ai_client_operation_duration_seconds_count", []string{`gen_ai_provider_name="openai"`}, 7},
		{"gen_ai_client_token_usage_count", []string{`gen_ai_token_type="output"`}, 3},
	} {
		if got := providertest.MetricSum(body, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(strings.TrimSuffix(metrics, "/metrics") + path)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %v %v", path, resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
	// The printed gateway lines work as printed: the token file, the
	// streamed request with its key, and the same key again (replayed).
	base := d.await(`OpenAI-compatible gateway at (http://\S+/v1) \(models: demo\)`)[1]
	tokenFile := d.await(`export OPENAI_BASE_URL=\S+ OPENAI_API_KEY=\$\(cat (\S+)\)`)[1]
	d.await(`curl -sN \$OPENAI_BASE_URL/chat/completions`)
	root := d.await(`export ANTHROPIC_BASE_URL=(\S+) ANTHROPIC_AUTH_TOKEN=\$\(cat \S+\) ANTHROPIC_MODEL=demo`)[1]
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	for i, replayed := range []string{"", "true"} {
		resp, body := gatewayPost(t, base, strings.TrimSpace(string(token)), "demo-1", `{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 200 || !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") || resp.Header.Get("X-Durallm-Replayed") != replayed {
			t.Fatalf("gateway request %d: %d %v\n%s", i, resp.StatusCode, resp.Header, body)
		}
	}
	// Anthropic's shape at the printed root, the token as the SDKs send it.
	req, _ := http.NewRequest(http.MethodPost, root+"/v1/messages", strings.NewReader(`{"model":"demo","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Anthropic-Version", "2026-10-21")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(msg), `"type":"message"`) {
		t.Fatalf("messages request: %d %s", resp.StatusCode, msg)
	}
	d.finish()
	// Every outcome of the demonstration is one durallm expects (a user's
	// cancel, an action awaiting a verdict): none is logged as a warning
	// or an error, so a real one stands out.
	if logs := d.err.String(); strings.Contains(logs, "level=ERROR") || strings.Contains(logs, "level=WARN") {
		t.Errorf("the demonstration logged warnings or errors:\n%s", logs)
	}

	// Restart over the same data directory: the waiting action is still
	// there, and a verdict finishes it.
	d2 := startDev(t, "--headless", "--port", "-1", "--data-dir", dir, "--no-demo", "--metrics-addr", "", "--stream-addr", "", "--gateway-addr", "")
	addr := d2.await(`server ready at (\S+)`)[1]
	d2.await(`worker polling`)
	var lst, errOut bytes.Buffer
	if code := dispatch([]string{"list", "--address", addr, "--state", "awaiting_reconciliation"}, &lst, &errOut); code != exitOK || !strings.Contains(lst.String(), waiting) {
		t.Fatalf("list exited %d: %q does not include %s (%s)", code, lst.String(), waiting, errOut.String())
	}
	var rec bytes.Buffer
	if code := dispatch([]string{"reconcile", "--address", addr, "--id", waiting, "--attempt", "1", "--verdict", "completed", "--text", "found it"}, &rec, &errOut); code != exitOK {
		t.Fatalf("reconcile exited %d: %s", code, errOut.String())
	}
	var st bytes.Buffer
	if code := dispatch([]string{"status", "--address", addr, "--id", waiting}, &st, &errOut); code != exitOK || !strings.Contains(st.String(), "reconciled") {
		t.Fatalf("status exited %d: %s", code, st.String())
	}
	d2.finish()
}

// TestDevEncryptsPayloads runs 'dev' with an encryption key: history
// holds no prompt or answer in the clear, while the CLI with the key reads
// the action normally and the UI's codec endpoint decodes.
func TestDevEncryptsPayloads(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "keys")
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 7)
	}
	if err := os.WriteFile(keyFile, []byte("k1:"+base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDev(t, "--headless", "--port", "-1", "--data-dir", filepath.Join(dir, "data"), "--metrics-addr", "", "--stream-addr", "", "--gateway-addr", "127.0.0.1:0", "--encryption-key", "file:"+keyFile)
	addr := d.await(`server ready at (\S+)`)[1]
	happy := d.await(`\[ok\] (demo-\d+-happy)`)[1]
	d.await(`awaits your verdict`)

	// Without the key: the raw history.
	tc, err := client.Dial(client.Options{HostPort: addr, Logger: quietLogger(os.Stderr)})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	iter := tc.GetWorkflowHistory(context.Background(), happy, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var checked int
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			t.Fatal(err)
		}
		var payloads []*commonpb.Payload
		if a := ev.GetWorkflowExecutionStartedEventAttributes(); a != nil {
			payloads = a.GetInput().GetPayloads()
		}
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil {
			payloads = a.GetInput().GetPayloads()
		}
		if a := ev.GetActivityTaskCompletedEventAttributes(); a != nil {
			payloads = a.GetResult().GetPayloads()
		}
		if a := ev.GetWorkflowExecutionCompletedEventAttributes(); a != nil {
			payloads = a.GetResult().GetPayloads()
		}
		for _, p := range payloads {
			checked++
			if enc := string(p.GetMetadata()["encoding"]); enc != "binary/encrypted" {
				t.Errorf("event %d %s: payload encoding %q, want binary/encrypted", ev.GetEventId(), ev.GetEventType(), enc)
			}
			if bytes.Contains(p.GetData(), []byte("Say hello to the demo")) {
				t.Errorf("event %d holds the prompt in the clear", ev.GetEventId())
			}
		}
	}
	if checked < 4 {
		t.Fatalf("only %d payloads checked", checked)
	}
	// The attempt journal, which holds the answers, is sealed with the
	// same keyring.
	entries, err := filepath.Glob(filepath.Join(dir, "data", "journal", "*.json"))
	if err != nil || len(entries) == 0 {
		t.Fatalf("journal entries: %v %v", entries, err)
	}
	for _, f := range entries {
		if b, err := os.ReadFile(f); err != nil || !codec.Sealed(b) {
			t.Errorf("journal entry %s is not sealed (%v): %.40q", filepath.Base(f), err, b)
		}
	}
	// The gateway's memo (the request's fingerprint and its caller) is
	// sealed too, and the gateway reads it back: the same key replays.
	base := d.await(`OpenAI-compatible gateway at (http://\S+/v1)`)[1]
	token, err := os.ReadFile(d.await(`OPENAI_API_KEY=\$\(cat (\S+)\)`)[1])
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for i, replayed := range []string{"", "true"} {
		resp, body := gatewayPost(t, base, string(token), "sealed-1", `{"model":"demo","messages":[{"role":"user","content":"Say hello to the demo"}]}`)
		if resp.StatusCode != 200 || resp.Header.Get("X-Durallm-Replayed") != replayed {
			t.Fatalf("gateway request %d: %d %v %s", i, resp.StatusCode, resp.Header, body)
		}
		id = resp.Header.Get("X-Durallm-Action-Id")
	}
	desc, err := tc.DescribeWorkflowExecution(context.Background(), id, "")
	if err != nil {
		t.Fatal(err)
	}
	memo := desc.GetWorkflowExecutionInfo().GetMemo().GetFields()
	if len(memo) == 0 {
		t.Fatal("the gateway's action has no memo")
	}
	for k, p := range memo {
		if enc := string(p.GetMetadata()["encoding"]); enc != "binary/encrypted" {
			t.Errorf("memo %s: encoding %q, want binary/encrypted", k, enc)
		}
	}
	// With the key: the CLI reads it.
	var st, errOut bytes.Buffer
	if code := dispatch([]string{"status", "--address", addr, "--id", happy, "--encryption-key", "file:" + keyFile}, &st, &errOut); code != exitOK || !strings.Contains(st.String(), "completed") {
		t.Fatalf("status with the key exited %d: %s %s", code, st.String(), errOut.String())
	}
	d.finish()
}

// TestDevRunsTheAgentExample runs examples/agent against 'durallm dev'
// and its demo provider, as its README says: the agent's own worker in
// this process, dialed with durallm.DataConverter over dev's result
// store, and the starter's steps (subscribe to the answer's stream by its
// action id, start the agent, wait) here too. The demo provider calls the
// agent's first tool once, then answers.
func TestDevRunsTheAgentExample(t *testing.T) {
	dataDir := t.TempDir()
	d := startDev(t, "--headless", "--port", "-1", "--data-dir", dataDir, "--no-demo", "--metrics-addr", "", "--stream-addr", "127.0.0.1:0")
	addr := d.await(`server ready at (\S+)`)[1]
	streams := d.await(`streamed text at (http://\S+)/v1/streams/`)[1]
	d.await(`worker polling`)
	store := resultstore.Dir{Path: filepath.Join(dataDir, "results")}
	tc, err := client.Dial(client.Options{HostPort: addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)), DataConverter: durallm.DataConverter(store)})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	w := sdkworker.New(tc, agent.TaskQueue, sdkworker.Options{})
	w.RegisterWorkflow(agent.Agent)
	w.RegisterActivity(&agent.Activities{Results: store})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	resp, err := http.Get(streams + "/v1/streams/" + step.ActionID("agent-dev", agent.CallName(2)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	deltas := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				deltas <- data
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "agent-dev", TaskQueue: agent.TaskQueue}, agent.Agent, agent.Input{Question: "Where is my order?", Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	var out agent.Output
	if err := run.Get(ctx, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Tools) != 1 || out.Tools[0].Name != "lookup_order" || out.Answer != "ok" || out.Turns != 2 {
		t.Fatalf("output %+v", out)
	}
	// The answer's one delta was published before the result.
	select {
	case data := <-deltas:
		if !strings.Contains(data, `"delta":"ok"`) {
			t.Fatalf("stream: %q", data)
		}
	case <-ctx.Done():
		t.Fatal("no delta on the answer's stream")
	}
	d.finish()
}

// gatewayPost sends one chat request to a gateway and reads the whole
// answer.
func gatewayPost(t *testing.T, base, token, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// 'durallm dev --routes FILE' serves those routes: its closing line names
// them rather than the demo's, and its gateway's requests are counted
// with the worker's metrics (durallm_gateway_requests_total).
func TestDevWithRoutesNamesThemAndCountsItsGatewaysRequests(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SetDefault(providertest.Answer("from my route"))
	routes := writeTemp(t, "routes.yaml", "routes:\n  - name: mine\n    kind: openai\n    base_url: "+p.HTTP1URL()+"/v1\n    model: m\n")
	dir := t.TempDir()
	d := startDev(t, "--headless", "--port", "-1", "--data-dir", dir, "--routes", routes, "--metrics-addr", "127.0.0.1:0", "--stream-addr", "", "--gateway-addr", "127.0.0.1:0")
	metrics := d.await(`metrics at (http://\S+/metrics)`)[1]
	base := d.await(`OpenAI-compatible gateway at (http://\S+/v1) \(models: mine\)`)[1]
	running := d.await(`Running\. (.*)`)[1]
	if strings.Contains(running, "demo-") || !strings.Contains(running, "mine") {
		t.Errorf("the closing line does not name the routes served: %s", running)
	}
	token, err := os.ReadFile(filepath.Join(dir, "gateway-token"))
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := gatewayPost(t, base, strings.TrimSpace(string(token)), "mine-1", `{"model":"mine","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 200 || !strings.Contains(body, "from my route") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	body, err := providertest.Scrape(metrics)
	if err != nil {
		t.Fatal(err)
	}
	if got := providertest.MetricSum(body, "durallm_gateway_requests_total", `status="200"`); got < 1 {
		t.Errorf("durallm_gateway_requests_total{status=200} = %v after a request", got)
	}
	d.finish()
}
