// Package telemetry holds durallm's metrics: OpenTelemetry instruments
// exported in the Prometheus format, the Temporal SDK's metrics routed
// through the same meter, and the worker's /metrics, /healthz and /readyz
// endpoints.
//
// Instrument names follow OpenTelemetry's GenAI semantic conventions where
// they exist (gen_ai.client.operation.duration, gen_ai.client.token.usage
// with gen_ai.provider.name, gen_ai.request.model, gen_ai.operation.name,
// error.type) and add the recovery ones under durallm.*. No attribute ever
// holds content, a header, a key or an id of a user action: only routes,
// models, providers, classifications, the provider-health flag, codes
// (peer-chosen ones bucketed by evidence.ErrCode.Label) and origins, so
// cardinality stays bounded. docs/operations.md lists every series and
// the alerts.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/recovery"
)

// Telemetry owns a meter provider with a Prometheus registry of its own
// (so tests and several workers in one process do not collide).
type Telemetry struct {
	reg      *prometheus.Registry
	provider *sdkmetric.MeterProvider
	tracer   *sdktrace.TracerProvider // nil when no span exporter is configured
	meter    metric.Meter
	log      *slog.Logger

	duration   metric.Float64Histogram
	tokens     metric.Int64Histogram
	attempts   metric.Int64Counter
	ambiguous  metric.Int64Counter
	empty      metric.Int64Counter
	truncated  metric.Int64Counter
	drainSends metric.Int64Counter
	// journalFailures counts journal writes that failed.
	journalFailures metric.Int64Counter
	// recordLookups and recordDuplicates count the built-in reconciler's
	// lookups of a provider's record.
	recordLookups    metric.Int64Counter
	recordDuplicates metric.Int64Counter
	// spentTokens and spentCost count what attempts used, by route and
	// caller: the tokens the provider reported, and their cost at the
	// route's prices.
	spentTokens metric.Int64Counter
	spentCost   metric.Float64Counter

	mu      sync.Mutex
	engines []*recovery.Engine
}

// Options configures New beyond the Prometheus endpoint, which is always
// on.
type Options struct {
	// Logger receives instrument and exporter errors. Nil means
	// slog.Default().
	Logger *slog.Logger
	// OTLP also exports metrics and traces to an OpenTelemetry collector
	// over gRPC, configured by the standard OTEL_EXPORTER_OTLP_* variables
	// (endpoint, headers, TLS). Default off.
	OTLP bool
	// SpanExporter, when set, receives the Temporal tracing interceptor's
	// spans (tests use an in-memory one). With OTLP it is used in
	// addition.
	SpanExporter sdktrace.SpanExporter
}

// OTLPConfigured reports whether the environment names an OTLP endpoint,
// the usual way to decide Options.OTLP.
func OTLPConfigured() bool {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if os.Getenv(v) != "" {
			return true
		}
	}
	return false
}

// New builds the meter provider and the project's instruments with the
// Prometheus endpoint only. logger nil means slog.Default().
func New(logger *slog.Logger) (*Telemetry, error) { return NewWithOptions(Options{Logger: logger}) }

// NewWithOptions builds the meter provider (Prometheus, plus OTLP when
// asked), the project's instruments and, when any span exporter is
// configured, a tracer provider for the Temporal tracing interceptor.
func NewWithOptions(o Options) (*Telemetry, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	t := &Telemetry{reg: reg, log: logger}
	readers := []sdkmetric.Option{sdkmetric.WithReader(exp)}
	var spanExporters []sdktrace.SpanExporter
	if o.SpanExporter != nil {
		spanExporters = append(spanExporters, o.SpanExporter)
	}
	if o.OTLP {
		ctx := context.Background()
		mexp, err := otlpmetricgrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP metric exporter: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp)))
		texp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
		}
		spanExporters = append(spanExporters, texp)
	}
	t.provider = sdkmetric.NewMeterProvider(readers...)
	if len(spanExporters) > 0 {
		var topts []sdktrace.TracerProviderOption
		for _, e := range spanExporters {
			topts = append(topts, sdktrace.WithBatcher(e))
		}
		t.tracer = sdktrace.NewTracerProvider(topts...)
	}
	t.meter = t.provider.Meter("github.com/durallm/durallm")
	m := t.meter
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var e error
	t.duration, e = m.Float64Histogram("gen_ai.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("GenAI operation duration, one per attempt"),
		metric.WithExplicitBucketBoundaries(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92))
	add(e)
	t.tokens, e = m.Int64Histogram("gen_ai.client.token.usage", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens used, by gen_ai.token.type (input, output)"),
		metric.WithExplicitBucketBoundaries(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576))
	add(e)
	t.attempts, e = m.Int64Counter("durallm.attempts", metric.WithDescription("Attempts by classification, route and whether the outcome moves the route's provider health"))
	add(e)
	t.ambiguous, e = m.Int64Counter("durallm.ambiguous", metric.WithDescription("Ambiguous attempts by route and reason"))
	add(e)
	t.empty, e = m.Int64Counter("durallm.empty_responses", metric.WithDescription("2xx answers without usable content, by provider and model"))
	add(e)
	t.truncated, e = m.Int64Counter("durallm.stream.truncations", metric.WithDescription("Streams cut after content started (completed_partial), by route"))
	add(e)
	t.drainSends, e = m.Int64Counter("durallm.sends_after_goaway", metric.WithDescription("Attempts whose request left on a connection that had already received GOAWAY (should stay 0)"))
	add(e)
	t.journalFailures, e = m.Int64Counter("durallm.journal.failures", metric.WithDescription("Attempt ends the worker could not write to the attempt journal (the outcome was reported without it)"))
	add(e)
	t.recordLookups, e = m.Int64Counter("durallm.provider_record.lookups", metric.WithDescription("The built-in reconciler's looks at a provider's record of an ambiguous attempt, by route and result (found, not_found, unusable, unreadable)"))
	add(e)
	t.recordDuplicates, e = m.Int64Counter("durallm.provider_record.duplicates", metric.WithDescription("Executions of an attempt beyond the first that a provider's record shows, by route: the request was sent twice on its way (should stay 0)"))
	add(e)
	t.spentTokens, e = m.Int64Counter("durallm.tokens", metric.WithDescription("Tokens the provider reported, by route, caller and durallm.token.type: input (prompt tokens the cache neither served nor stored), cached_input, cache_write_input, output; the types add up to prompt plus completion tokens"))
	add(e)
	t.spentCost, e = m.Float64Counter("durallm.cost", metric.WithDescription("Cost of the tokens the provider reported, at the route's prices (per million tokens, in the routes file's currency), by route and caller; routes without prices add nothing"))
	add(e)
	if err := t.engineCounters(); err != nil {
		add(err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("telemetry: instruments: %w", err)
	}
	return t, nil
}

// Meter is the project's meter, for callers that add instruments.
func (t *Telemetry) Meter() metric.Meter { return t.meter }

// TemporalMetricsHandler routes the Temporal SDK's metrics (and workflow
// metrics recorded through workflow.GetMetricsHandler) into the same
// registry. Instrument errors are logged, never a panic.
func (t *Telemetry) TemporalMetricsHandler() client.MetricsHandler {
	return temporalotel.NewMetricsHandler(temporalotel.MetricsHandlerOptions{
		Meter:   t.provider.Meter("temporal-sdk-go"),
		OnError: func(err error) { t.log.Warn("temporal metric error", "error", err) },
	})
}

// TracingInterceptor returns the Temporal SDK's OpenTelemetry tracing
// interceptor (workflow, activity, signal, query and Update spans, with the
// trace carried across them in headers), or nil when no span exporter is
// configured. Give it to the client (client.Options.Interceptors); the
// client's workers use it too.
func (t *Telemetry) TracingInterceptor() (interceptor.Interceptor, error) {
	if t.tracer == nil {
		return nil, nil
	}
	i, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{Tracer: t.tracer.Tracer("github.com/durallm/durallm")})
	if err != nil {
		return nil, fmt.Errorf("telemetry: tracing interceptor: %w", err)
	}
	return i, nil
}

// WatchEngine exports an engine's counters (connections opened, GOAWAYs
// by code, 421 quarantines, transport replays, lost framing, attempts
// that may have been sent as their context ended, frames kept off the
// wire for refused streams).
func (t *Telemetry) WatchEngine(e *recovery.Engine) {
	t.mu.Lock()
	t.engines = append(t.engines, e)
	t.mu.Unlock()
}

func (t *Telemetry) engineCounters() error {
	m := t.meter
	conns, err1 := m.Int64ObservableCounter("durallm.connections.opened", metric.WithDescription("Connections the engine opened (HTTP/2 and HTTP/1.1)"))
	goaways, err2 := m.Int64ObservableCounter("durallm.goaways", metric.WithDescription("GOAWAY frames received, by http2.error_code"))
	quarantines, err3 := m.Int64ObservableCounter("durallm.quarantines", metric.WithDescription("Connections quarantined after a 421"))
	replays, err4 := m.Int64ObservableCounter("durallm.transport.replays", metric.WithDescription("Streams that re-sent an attempt already sent (should stay 0)"))
	lost, err5 := m.Int64ObservableCounter("durallm.observer.lost", metric.WithDescription("Connections whose HTTP/2 framing the observer could not follow"))
	maybeSent, err6 := m.Int64ObservableCounter("durallm.maybe_sent", metric.WithDescription("Attempts whose context ended mid-send with no proof their HEADERS stayed (ambiguous, not unsent)"))
	refusedDropped, err8 := m.Int64ObservableCounter("durallm.refused_stream.frames_dropped", metric.WithDescription("Frames the HTTP/2 client wrote for a stream a received GOAWAY had refused, kept off the wire"))
	keepAlive, err7 := m.Int64ObservableCounter("durallm.http1.keepalive", metric.WithDescription("HTTP/1.1 keep-alive decisions, by decision: reused, closed_idle (found closed by the server, discarded unwritten), expired (closed at the engine's idle timeout), race_lost (a reused connection closed after the request: ambiguous)"))
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8); err != nil {
		return err
	}
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		t.mu.Lock()
		engines := append([]*recovery.Engine(nil), t.engines...)
		t.mu.Unlock()
		var sum recovery.Stats
		byCode := map[string]int64{}
		for _, e := range engines {
			s := e.Stats()
			sum.ConnsOpened += s.ConnsOpened
			sum.Quarantines += s.Quarantines
			sum.TransportReplays += s.TransportReplays
			sum.ObserverLost += s.ObserverLost
			sum.MaybeSent += s.MaybeSent
			sum.RefusedStreamFramesDropped += s.RefusedStreamFramesDropped
			sum.HTTP1Reused += s.HTTP1Reused
			sum.HTTP1ClosedIdle += s.HTTP1ClosedIdle
			sum.HTTP1Expired += s.HTTP1Expired
			sum.HTTP1RaceLost += s.HTTP1RaceLost
			for k, v := range s.GoAways {
				byCode[k] += v
			}
		}
		o.ObserveInt64(conns, sum.ConnsOpened)
		o.ObserveInt64(quarantines, sum.Quarantines)
		o.ObserveInt64(replays, sum.TransportReplays)
		o.ObserveInt64(lost, sum.ObserverLost)
		o.ObserveInt64(maybeSent, sum.MaybeSent)
		o.ObserveInt64(refusedDropped, sum.RefusedStreamFramesDropped)
		for decision, n := range map[string]int64{"reused": sum.HTTP1Reused, "closed_idle": sum.HTTP1ClosedIdle, "expired": sum.HTTP1Expired, "race_lost": sum.HTTP1RaceLost} {
			o.ObserveInt64(keepAlive, n, metric.WithAttributes(attribute.String("decision", decision)))
		}
		for code, n := range byCode {
			// Keys are ErrCode.Label values (RFC names or UNKNOWN), never
			// the peer's raw code, so this attribute stays bounded.
			o.ObserveInt64(goaways, n, metric.WithAttributes(attribute.String("http2.error_code", code)))
		}
		return nil
	}, conns, goaways, quarantines, replays, lost, maybeSent, refusedDropped, keepAlive)
	return err
}

// Attempt describes one finished attempt for RecordAttempt. It carries
// no content.
type Attempt struct {
	Route, Provider, Model string
	Evidence               evidence.Evidence
	Class                  evidence.Classification
	InputTokens            int
	OutputTokens           int
	// CachedInputTokens and CacheWriteInputTokens are the prompt tokens
	// the provider's cache served and stored (part of InputTokens).
	CachedInputTokens, CacheWriteInputTokens int
	// Cost is the usage at the route's prices, when Priced.
	Cost   float64
	Priced bool
	// Caller is the action's caller, a label on durallm.tokens and
	// durallm.cost; empty when none.
	Caller string
}

// JournalFailed counts one attempt end the worker could not journal.
func (t *Telemetry) JournalFailed(ctx context.Context) {
	if t == nil {
		return
	}
	t.journalFailures.Add(ctx, 1)
}

// ProviderRecordLookup counts one look at a provider's record for an
// ambiguous attempt on route, with its result (found, not_found,
// unusable, unreadable) and the executions beyond the first it showed.
func (t *Telemetry) ProviderRecordLookup(ctx context.Context, route, result string, duplicates int) {
	if t == nil {
		return
	}
	r := attribute.String("route", route)
	t.recordLookups.Add(ctx, 1, metric.WithAttributes(r, attribute.String("result", result)))
	if duplicates > 0 {
		t.recordDuplicates.Add(ctx, int64(duplicates), metric.WithAttributes(r))
	}
}

// RecordAttempt records one attempt's duration, tokens and classification.
func (t *Telemetry) RecordAttempt(ctx context.Context, a Attempt) {
	if t == nil {
		return
	}
	class := string(a.Class.Class)
	common := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("gen_ai.provider.name", a.Provider),
		attribute.String("gen_ai.request.model", a.Model),
		attribute.String("durallm.route", a.Route),
	}
	durAttrs := common
	if a.Class.Class != evidence.Completed {
		durAttrs = append(append([]attribute.KeyValue(nil), common...), attribute.String("error.type", class))
	}
	t.duration.Record(ctx, a.Evidence.Elapsed.Seconds(), metric.WithAttributes(durAttrs...))
	if a.InputTokens > 0 {
		t.tokens.Record(ctx, int64(a.InputTokens), metric.WithAttributes(append(common, attribute.String("gen_ai.token.type", "input"))...))
	}
	if a.OutputTokens > 0 {
		t.tokens.Record(ctx, int64(a.OutputTokens), metric.WithAttributes(append(common, attribute.String("gen_ai.token.type", "output"))...))
	}
	// durallm.provider_health is the classification's own flag, exported
	// as classified and never recomputed here, so a dashboard can prove on
	// this one counter that canceled, misdirected and rejected attempts
	// are counted yet never move a route's health (docs/contract.md section 4.8).
	// It adds few series: the class decides it except for ambiguous and
	// refused attempts.
	t.attempts.Add(ctx, 1, metric.WithAttributes(
		attribute.String("durallm.classification", class),
		attribute.String("durallm.route", a.Route),
		attribute.Bool("durallm.provider_health", a.Class.ProviderHealth)))
	switch a.Class.Class {
	case evidence.Ambiguous:
		// Ambiguous reasons are constants or carry a peer's code only as
		// ErrCode.Label, so durallm.reason is bounded. Other classes'
		// reasons are not exported: "status_N" holds the peer's status,
		// which x/net parses as any integer.
		t.ambiguous.Add(ctx, 1, metric.WithAttributes(attribute.String("durallm.route", a.Route), attribute.String("durallm.reason", a.Class.Reason)))
	case evidence.EmptyResponse:
		t.empty.Add(ctx, 1, metric.WithAttributes(attribute.String("gen_ai.provider.name", a.Provider), attribute.String("gen_ai.request.model", a.Model)))
	case evidence.CommittedPartial:
		t.truncated.Add(ctx, 1, metric.WithAttributes(attribute.String("durallm.route", a.Route)))
	}
	if a.Evidence.SentAfterGoAway {
		t.drainSends.Add(ctx, 1, metric.WithAttributes(attribute.String("durallm.route", a.Route)))
	}
	t.recordSpend(ctx, a)
}

// recordSpend counts an attempt's tokens by type and its cost.
func (t *Telemetry) recordSpend(ctx context.Context, a Attempt) {
	who := []attribute.KeyValue{attribute.String("durallm.route", a.Route)}
	if a.Caller != "" {
		who = append(who, attribute.String("durallm.caller", a.Caller))
	}
	cached, written := max(0, a.CachedInputTokens), max(0, a.CacheWriteInputTokens)
	for _, c := range []struct {
		typ string
		n   int
	}{
		{"input", max(0, a.InputTokens-cached-written)}, {"cached_input", cached},
		{"cache_write_input", written}, {"output", a.OutputTokens},
	} {
		if c.n > 0 {
			t.spentTokens.Add(ctx, int64(c.n), metric.WithAttributes(append(who, attribute.String("durallm.token.type", c.typ))...))
		}
	}
	if a.Priced && a.Cost > 0 {
		t.spentCost.Add(ctx, a.Cost, metric.WithAttributes(who...))
	}
}

// Handler serves /metrics in the Prometheus text format, /healthz (the
// process is up) and /readyz (ready reports nil).
func (t *Telemetry) Handler(ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(t.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if ready != nil {
			if err := ready(ctx); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// Flush exports what the meter and tracer providers hold now.
func (t *Telemetry) Flush(ctx context.Context) error {
	var terr error
	if t.tracer != nil {
		terr = t.tracer.ForceFlush(ctx)
	}
	return errors.Join(t.provider.ForceFlush(ctx), terr)
}

// Shutdown flushes and stops the meter and tracer providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var terr error
	if t.tracer != nil {
		terr = t.tracer.Shutdown(ctx)
	}
	return errors.Join(t.provider.Shutdown(ctx), terr)
}
