package telemetry_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
)

func newTelemetry(t *testing.T) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

// scrape reads /metrics the way Prometheus would: the text exposition is
// what dashboards see, so it is what the tests check.
func scrape(t *testing.T, tel *telemetry.Telemetry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// wire is a scripted provider and an engine pointed at it, watched by tel.
type wire struct {
	p *providertest.Provider
	e *recovery.Engine
}

func newWire(t *testing.T, tel *telemetry.Telemetry) *wire {
	t.Helper()
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	e := recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() {
		e.Close()
		p.Close()
	})
	tel.WatchEngine(e)
	return &wire{p: p, e: e}
}

// attempt sends one request through the engine and returns what the
// activity would hand to RecordAttempt.
func (w *wire) attempt(t *testing.T, key string) telemetry.Attempt {
	t.Helper()
	a := recovery.NewAttempt(recovery.Spec{IdempotencyKey: key, Route: "r1"})
	req, err := http.NewRequestWithContext(recovery.WithAttempt(t.Context(), a), http.MethodPost, w.p.URL()+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if resp, err := w.e.RoundTrip(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	ev, c := a.Finish(evidence.SignalNone)
	return telemetry.Attempt{Route: "r1", Provider: "openai", Model: "m", Evidence: ev, Class: c}
}

// Defect 16: peer-chosen error codes became metric label values
// (UNKNOWN_0x…, rst_stream_<code>). A peer picks any 32-bit GOAWAY or
// RST_STREAM code; every attribute value must come from a bounded set, so
// an unassigned code is exported as the bucket UNKNOWN.
func TestPeerChosenErrorCodesDoNotBecomeMetricLabelValues(t *testing.T) {
	tel := newTelemetry(t)
	w := newWire(t, tel)
	const peerCode = http2.ErrCode(0xdeadbeef)
	w.p.Push(providertest.GoAwayAbove(peerCode), providertest.ResetStream(peerCode))

	ga := w.attempt(t, "goaway")
	if ga.Evidence.GoAway == nil || uint32(ga.Evidence.GoAway.Code) != uint32(peerCode) {
		t.Fatalf("first attempt saw GOAWAY %+v, want code %#x", ga.Evidence.GoAway, uint32(peerCode))
	}
	tel.RecordAttempt(t.Context(), ga)
	rst := w.attempt(t, "reset")
	if rst.Class.Class != evidence.Ambiguous || rst.Evidence.RSTStream == nil || uint32(*rst.Evidence.RSTStream) != uint32(peerCode) {
		t.Fatalf("second attempt %+v with RST_STREAM %v, want ambiguous with code %#x", rst.Class, rst.Evidence.RSTStream, uint32(peerCode))
	}
	tel.RecordAttempt(t.Context(), rst)

	// A status is peer-chosen too (x/net accepts any integer), and its
	// reason "status_N" must stay out of metrics.
	odd := evidence.Evidence{ConnRef: "p-c9", RequestSent: true, StreamID: 1, ResponseHeaders: true, Status: 987654}
	tel.RecordAttempt(t.Context(), telemetry.Attempt{Route: "r1", Provider: "openai", Model: "m", Evidence: odd, Class: evidence.Classify(odd)})

	body := scrape(t, tel)
	if got := providertest.MetricSum(body, "durallm_goaways_total", `http2_error_code="UNKNOWN"`); got != 1 {
		t.Errorf(`durallm_goaways_total{http2_error_code="UNKNOWN"} = %v, want 1`, got)
	}
	if got := providertest.MetricSum(body, "durallm_ambiguous_total", `durallm_reason="rst_stream_UNKNOWN"`); got != 1 {
		t.Errorf(`durallm_ambiguous_total{durallm_reason="rst_stream_UNKNOWN"} = %v, want 1`, got)
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "durallm_") && (strings.Contains(strings.ToLower(line), "deadbeef") || strings.Contains(line, "987654")) {
			t.Errorf("the peer's code reached a label value: %s", line)
		}
	}
}

// Defect 17: provider health was a per-attempt flag that nothing exported.
// docs/contract.md section 4.8: only provider-attributable outcomes move a route's
// health; canceled, misdirected, rejected and a NO_ERROR drain never do. The
// flag is exported as it was classified, so a dashboard can prove that.
func TestProviderHealthIsExported(t *testing.T) {
	tel := newTelemetry(t)
	sent := evidence.Evidence{ConnRef: "p-c1", RequestSent: true, StreamID: 3}
	status := func(s int) evidence.Evidence { ev := sent; ev.ResponseHeaders, ev.Status = true, s; return ev }
	drain := sent
	drain.GoAway = &evidence.GoAway{LastStreamID: 1, Code: evidence.CodeNoError}
	canceled := sent
	canceled.Canceled = true
	attempts := []struct {
		ev     evidence.Evidence
		class  evidence.Class
		health string
	}{
		{canceled, evidence.Canceled, "false"},
		{status(429), evidence.Throttled, "true"},
		{status(421), evidence.Misdirected, "false"},
		{status(400), evidence.Rejected, "false"},
		{drain, evidence.Refused, "false"},
		{status(500), evidence.UpstreamError, "true"},
	}
	for _, a := range attempts {
		c := evidence.Classify(a.ev)
		if c.Class != a.class {
			t.Fatalf("evidence %+v classified %s, want %s", a.ev, c.Class, a.class)
		}
		tel.RecordAttempt(t.Context(), telemetry.Attempt{Route: "r1", Provider: "openai", Model: "m", Evidence: a.ev, Class: c})
	}

	body := scrape(t, tel)
	for _, a := range attempts {
		class := `durallm_classification="` + string(a.class) + `"`
		if got := providertest.MetricSum(body, "durallm_attempts_total", class, `durallm_provider_health="`+a.health+`"`); got != 1 {
			t.Errorf(`durallm_attempts_total{%s,durallm_provider_health=%q} = %v, want 1`, class, a.health, got)
		}
	}
	// The dashboard's proof: attempts counted against health are exactly
	// the throttled and the upstream_error one, never the canceled one.
	if got := providertest.MetricSum(body, "durallm_attempts_total", `durallm_provider_health="true"`); got != 2 {
		t.Errorf(`sum(durallm_attempts_total{durallm_provider_health="true"}) = %v, want 2`, got)
	}
	if got := providertest.MetricSum(body, "durallm_attempts_total", `durallm_classification="canceled"`, `durallm_provider_health="true"`); got != 0 {
		t.Errorf("a canceled attempt counted against provider health: %v", got)
	}
}

// Every attempt's tokens and cost are counted by route and caller: the
// token types add up to the provider's prompt plus completion tokens, and
// the cost is the one the activity priced. Nothing else is a label.
func TestTokensAndCostAreCountedByRouteAndCaller(t *testing.T) {
	tel := newTelemetry(t)
	ev := evidence.Evidence{ConnRef: "p-c1", RequestSent: true, StreamID: 3, ResponseHeaders: true, Status: 200, ContentStarted: true}
	c := evidence.Classify(ev)
	tel.RecordAttempt(t.Context(), telemetry.Attempt{Route: "r1", Provider: "openai", Model: "m", Evidence: ev, Class: c, Caller: "team-a",
		InputTokens: 1000, CachedInputTokens: 600, CacheWriteInputTokens: 100, OutputTokens: 50, Cost: 0.25, Priced: true})
	tel.RecordAttempt(t.Context(), telemetry.Attempt{Route: "r1", Provider: "openai", Model: "m", Evidence: ev, Class: c, Caller: "team-a",
		InputTokens: 10, OutputTokens: 5, Cost: 0.5, Priced: true})
	tel.RecordAttempt(t.Context(), telemetry.Attempt{Route: "r2", Provider: "openai", Model: "m", Evidence: ev, Class: c, InputTokens: 7, OutputTokens: 3})

	body := scrape(t, tel)
	for _, tt := range []struct {
		labels []string
		want   float64
	}{
		{[]string{`durallm_route="r1"`, `durallm_caller="team-a"`, `durallm_token_type="input"`}, 300 + 10},
		{[]string{`durallm_route="r1"`, `durallm_caller="team-a"`, `durallm_token_type="cached_input"`}, 600},
		{[]string{`durallm_route="r1"`, `durallm_caller="team-a"`, `durallm_token_type="cache_write_input"`}, 100},
		{[]string{`durallm_route="r1"`, `durallm_caller="team-a"`, `durallm_token_type="output"`}, 55},
		{[]string{`durallm_route="r2"`}, 10},
	} {
		if got := providertest.MetricSum(body, "durallm_tokens_total", tt.labels...); got != tt.want {
			t.Errorf("durallm_tokens_total%v = %v, want %v", tt.labels, got, tt.want)
		}
	}
	if got := providertest.MetricSum(body, "durallm_cost_total", `durallm_route="r1"`, `durallm_caller="team-a"`); got != 0.75 {
		t.Errorf("durallm_cost_total{r1,team-a} = %v, want 0.75", got)
	}
	if got := providertest.MetricSum(body, "durallm_cost_total", `durallm_route="r2"`); got != 0 {
		t.Errorf("an unpriced route has a cost: %v", got)
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "durallm_tokens_total{") && strings.Contains(line, `durallm_route="r2"`) && strings.Contains(line, "durallm_caller") {
			t.Errorf("an action without a caller has a caller label: %s", line)
		}
	}
}
