package recovery_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/recovery"
)

// BenchmarkTransport compares the engine with a bare x/net http2.Transport
// against the same loopback TLS HTTP/2 server (net/http's), in the same
// run, sequentially and with 64 concurrent streams; and, as the http1/
// variants, the engine's HTTP/1.1 client with a bare net/http.Transport
// against one cleartext HTTP/1.1 server (net/http's, as local model
// servers are), both keeping up to 64 idle connections. "bare" sends the
// request as it is; "bare+headers" also sends what the engine adds to every
// request and the contract requires (docs/contract.md section 5.4: the action's
// Idempotency-Key and a unique per-attempt id), so engine vs bare+headers
// is the engine's own mechanics (observer, pool, attempt record) and
// bare+headers vs bare is the cost of those two unique header values. Besides ns/op and
// allocs/op it reports req/s, p50/p99 latency and cpu-ns/op (user+system
// CPU of the whole process, client and server, per request): the engine's
// added CPU is its cpu-ns/op minus the bare transport's.
//
//	go test -run '^$' -bench BenchmarkTransport -benchtime 20000x -count 5 ./recovery/
func BenchmarkTransport(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	tlsConfig := &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	h1srv := httptest.NewServer(srv.Config.Handler)
	defer h1srv.Close()

	transports := []struct {
		name string
		make func() (http.RoundTripper, func())
		url  string // empty: the HTTP/2 server
	}{
		{"bare", func() (http.RoundTripper, func()) {
			t := &http2.Transport{TLSClientConfig: tlsConfig}
			return t, t.CloseIdleConnections
		}, ""},
		{"bare+headers", func() (http.RoundTripper, func()) {
			t := &http2.Transport{TLSClientConfig: tlsConfig}
			return withContractHeaders{rt: t}, t.CloseIdleConnections
		}, ""},
		{"engine", func() (http.RoundTripper, func()) {
			e := recovery.New(recovery.Config{TLSClientConfig: tlsConfig, Logger: slog.New(slog.DiscardHandler)})
			return e, func() { e.Close() }
		}, ""},
		{"engine+key", func() (http.RoundTripper, func()) {
			e := recovery.New(recovery.Config{TLSClientConfig: tlsConfig, Logger: slog.New(slog.DiscardHandler)})
			return withContractHeaders{rt: e, keyOnly: true}, func() { e.Close() }
		}, ""},
		{"http1/bare", func() (http.RoundTripper, func()) {
			t := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
			return t, t.CloseIdleConnections
		}, h1srv.URL},
		{"http1/bare+headers", func() (http.RoundTripper, func()) {
			t := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
			return withContractHeaders{rt: t}, t.CloseIdleConnections
		}, h1srv.URL},
		{"http1/engine+key", func() (http.RoundTripper, func()) {
			e := recovery.New(recovery.Config{MaxIdleHTTP1PerAuthority: 64, Logger: slog.New(slog.DiscardHandler)})
			return withContractHeaders{rt: e, keyOnly: true}, func() { e.Close() }
		}, h1srv.URL},
	}
	for _, mode := range []struct {
		name string
		par  int
	}{{"sequential", 1}, {"concurrent64", 64}} {
		for _, tr := range transports {
			b.Run(mode.name+"/"+tr.name, func(b *testing.B) {
				rt, closeFn := tr.make()
				defer closeFn()
				url := tr.url
				if url == "" {
					url = srv.URL
				}
				do := func(ctx context.Context) time.Duration {
					start := time.Now()
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
					resp, err := rt.RoundTrip(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					return time.Since(start)
				}
				do(context.Background()) // dial outside the measurement
				lat := make([]time.Duration, 0, b.N)
				var mu sync.Mutex
				cpu0 := cpuTime()
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				if mode.par == 1 {
					for range b.N {
						lat = append(lat, do(context.Background()))
					}
				} else {
					// RunParallel starts GOMAXPROCS×p goroutines: 64 streams in flight.
					b.SetParallelism(max(1, mode.par/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						local := make([]time.Duration, 0, 64)
						for pb.Next() {
							local = append(local, do(context.Background()))
						}
						mu.Lock()
						lat = append(lat, local...)
						mu.Unlock()
					})
				}
				elapsed := time.Since(start)
				b.StopTimer()
				cpu := cpuTime() - cpu0
				slices.Sort(lat)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}

// withContractHeaders adds a unique Idempotency-Key and attempt id to each
// request, as the engine does for a workflow's attempt, so the bare
// transport pays the same HPACK cost for them. With keyOnly it adds the
// key alone, for the engine, which adds the attempt id itself.
type withContractHeaders struct {
	rt      http.RoundTripper
	keyOnly bool
}

var benchSeq atomic.Uint64

func (w withContractHeaders) RoundTrip(req *http.Request) (*http.Response, error) {
	n := strconv.FormatUint(benchSeq.Add(1), 36)
	req.Header.Set(recovery.HeaderIdempotencyKey, "action-"+n)
	if !w.keyOnly {
		req.Header.Set(recovery.HeaderAttemptID, "0123456789abcdef-"+n)
	}
	return w.rt.RoundTrip(req)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
