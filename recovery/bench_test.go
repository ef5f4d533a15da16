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
	servers := startBenchServers(b)
	transports := benchTransports(servers.tlsConfig)
	for _, mode := range []struct {
		name string
		par  int
	}{{"sequential", 1}, {"concurrent64", 64}} {
		for _, tr := range transports {
			b.Run(mode.name+"/"+tr.name, func(b *testing.B) {
				rt, closeFn := tr.make()
				defer closeFn()
				do := benchRequest(b, rt, servers.url(tr.http1))
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

// BenchmarkTransportPaired measures what the engine's own mechanics cost
// per request, as BenchmarkTransport's engine+key minus bare+headers
// does, on a machine too shared for separate runs to compare: both
// transports run in one process against the same server, in alternating
// blocks of pairedBlock requests, and each block's process CPU
// (getrusage, client and server) and wall time go to the transport that
// ran it. Load from other processes then falls on both alike, where
// separate runs minutes apart saw it swing cpu-ns/op by half. It reports
// each side's cpu-ns/op and per-request wall time, engine-cpu-ns/op (the
// difference) and the throughput ratio (bare+headers' wall time over the
// engine's).
//
//	go test -run '^$' -bench BenchmarkTransportPaired -benchtime 40000x ./recovery/
func BenchmarkTransportPaired(b *testing.B) {
	servers := startBenchServers(b)
	var bare, engine benchTransport
	for _, tr := range benchTransports(servers.tlsConfig) {
		switch tr.name {
		case "bare+headers":
			bare = tr
		case "engine+key":
			engine = tr
		}
	}
	for _, mode := range []struct {
		name string
		par  int
	}{{"sequential", 1}, {"concurrent64", 64}} {
		b.Run(mode.name, func(b *testing.B) {
			var do [2]func(context.Context) time.Duration
			for i, tr := range []benchTransport{bare, engine} {
				rt, closeFn := tr.make()
				defer closeFn()
				do[i] = benchRequest(b, rt, servers.url(tr.http1))
				for range mode.par {
					do[i](context.Background()) // dial and warm outside the measurement
				}
			}
			var cpu, wall [2]time.Duration
			var n [2]int
			b.ResetTimer()
			for done, i := 0, 0; done < b.N; done, i = done+pairedBlock, 1-i {
				k := min(pairedBlock, b.N-done)
				c0, w0 := cpuTime(), time.Now()
				runBlock(k, mode.par, do[i])
				cpu[i] += cpuTime() - c0
				wall[i] += time.Since(w0)
				n[i] += k
			}
			b.StopTimer()
			if n[0] == 0 || n[1] == 0 {
				return // too small a b.N for one block each (the first probe run)
			}
			per := func(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / float64(n) }
			b.ReportMetric(per(cpu[0], n[0]), "bare+headers-cpu-ns/op")
			b.ReportMetric(per(cpu[1], n[1]), "engine+key-cpu-ns/op")
			b.ReportMetric(per(cpu[1], n[1])-per(cpu[0], n[0]), "engine-cpu-ns/op")
			b.ReportMetric(per(wall[0], n[0])/per(wall[1], n[1]), "throughput-ratio")
		})
	}
}

// pairedBlock is how many requests BenchmarkTransportPaired sends through
// one transport before switching: ~0.1 s, long against getrusage's
// resolution, short against the load swings of a shared machine.
const pairedBlock = 500

// runBlock sends n requests with do, par at a time.
func runBlock(n, par int, do func(context.Context) time.Duration) {
	if par == 1 {
		for range n {
			do(context.Background())
		}
		return
	}
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for range par {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				do(context.Background())
			}
		})
	}
	wg.Wait()
}

// benchServers are the servers BenchmarkTransport and
// BenchmarkTransportPaired talk to: net/http's, HTTP/2 over loopback TLS
// and cleartext HTTP/1.1, with one handler that reads the request and
// answers a small chat completion.
type benchServers struct {
	h2, h1    *httptest.Server
	tlsConfig *tls.Config
}

func startBenchServers(b *testing.B) benchServers {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	b.Cleanup(srv.Close)
	h1srv := httptest.NewServer(srv.Config.Handler)
	b.Cleanup(h1srv.Close)
	return benchServers{h2: srv, h1: h1srv, tlsConfig: &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}}
}

func (s benchServers) url(http1 bool) string {
	if http1 {
		return s.h1.URL
	}
	return s.h2.URL
}

type benchTransport struct {
	name  string
	make  func() (http.RoundTripper, func())
	http1 bool // talks to the HTTP/1.1 server
}

func benchTransports(tlsConfig *tls.Config) []benchTransport {
	return []benchTransport{
		{"bare", func() (http.RoundTripper, func()) {
			t := &http2.Transport{TLSClientConfig: tlsConfig}
			return t, t.CloseIdleConnections
		}, false},
		{"bare+headers", func() (http.RoundTripper, func()) {
			t := &http2.Transport{TLSClientConfig: tlsConfig}
			return withContractHeaders{rt: t}, t.CloseIdleConnections
		}, false},
		{"engine", func() (http.RoundTripper, func()) {
			e := recovery.New(recovery.Config{TLSClientConfig: tlsConfig, Logger: slog.New(slog.DiscardHandler)})
			return e, func() { e.Close() }
		}, false},
		{"engine+key", func() (http.RoundTripper, func()) {
			e := recovery.New(recovery.Config{TLSClientConfig: tlsConfig, Logger: slog.New(slog.DiscardHandler)})
			return withContractHeaders{rt: e, keyOnly: true}, func() { e.Close() }
		}, false},
		{"http1/bare", func() (http.RoundTripper, func()) {
			t := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
			return t, t.CloseIdleConnections
		}, true},
		{"http1/bare+headers", func() (http.RoundTripper, func()) {
			t := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
			return withContractHeaders{rt: t}, t.CloseIdleConnections
		}, true},
		{"http1/engine+key", func() (http.RoundTripper, func()) {
			e := recovery.New(recovery.Config{MaxIdleHTTP1PerAuthority: 64, Logger: slog.New(slog.DiscardHandler)})
			return withContractHeaders{rt: e, keyOnly: true}, func() { e.Close() }
		}, true},
	}
}

// benchRequest returns a function that posts one small request through rt
// to url, reads the answer to its end and returns the latency.
func benchRequest(b *testing.B, rt http.RoundTripper, url string) func(context.Context) time.Duration {
	return func(ctx context.Context) time.Duration {
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
