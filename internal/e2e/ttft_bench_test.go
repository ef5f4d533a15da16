package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"github.com/durallm/durallm/providers/exchange"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// firstDelta is a exchange.Sink that notes when the first text arrives.
type firstDelta struct{ at chan time.Time }

func (f *firstDelta) Delta(string) {
	select {
	case f.at <- time.Now():
	default:
	}
}
func (f *firstDelta) Incomplete(string) {}

// BenchmarkTimeToFirstToken is what a chat user feels: from the call to
// the first generated text of a streamed answer, at concurrency 1, in the
// same run for three paths to the same provider (the providertest
// provider over loopback TLS, streaming its answer at once):
//
//   - direct: the request sent straight to the provider through the
//     recovery engine (exchange.CallOpenAI), the baseline;
//   - durable-sink: a streamed LLMAction started through durallm.Client,
//     the text read from the worker's in-process hub (Streams.Subscribe);
//   - durable-sse: the same, the text read as server-sent events from the
//     worker's stream endpoint, as a caller in another process would;
//   - durable-sink+eager-start: durable-sink with eager workflow start,
//     which a caller in the worker's process can use;
//   - gateway: a streamed POST /v1/chat/completions to durallm's gateway
//     with its worker in its process (shared client and hub, eager start),
//     to the first content chunk;
//   - gateway-messages: the same request as a streamed POST /v1/messages
//     to the same gateway, to the first text_delta event;
//   - gateway-responses: the same request as a streamed POST
//     /v1/responses to the same gateway, to the first
//     response.output_text.delta event;
//   - gateway-worker-elsewhere: the same through a gateway with a
//     Temporal client of its own and no hub ('durallm gateway
//     --worker=false'), the worker in another process (this binary run
//     as TestHelperBenchWorker): the gateway finds the attempt's stream
//     through the worker's identity and reads its stream endpoint.
//
// Each reports ttft-p50/p90/p99-ms after latencyWarmup unmeasured runs;
// the durable rows' overhead is theirs minus direct's, in the same run.
//
//	go test -run '^$' -bench BenchmarkTimeToFirstToken -benchtime 200x ./internal/e2e/
func BenchmarkTimeToFirstToken(b *testing.B) {
	st := newServerStack(b, nil, worker.Options{TaskQueue: "ttft", WorkflowPollers: 8, ActivityPollers: 8, StreamAddr: "127.0.0.1:0"})
	p, tcl, w, route := st.p, st.tc, st.w, st.route
	c := durallm.NewClient(tcl, "ttft")
	engine := recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler)})
	defer engine.Close()
	req := providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hello")}, Stream: true}
	in := workflows.ActionInput{Request: req, Routes: []string{"r"}}
	ctx := context.Background()

	direct := func(int) (time.Duration, error) {
		sink := &firstDelta{at: make(chan time.Time, 1)}
		t0 := time.Now()
		if _, err := exchange.CallOpenAI(ctx, engine, exchange.Call{Route: route, Request: req, Sink: sink}); err != nil {
			return 0, err
		}
		return (<-sink.at).Sub(t0), nil
	}
	viaSink := func(c *durallm.Client) func(int) (time.Duration, error) {
		return func(i int) (time.Duration, error) {
			id := fmt.Sprintf("ttft-sink-%d", i)
			events, stop := w.Streams().Subscribe(id, 64)
			defer stop()
			t0 := time.Now()
			a, err := c.Start(ctx, id, in)
			if err != nil {
				return 0, err
			}
			for {
				select {
				case ev := <-events:
					if ev.Delta != "" {
						d := time.Since(t0)
						_, err := a.Result(ctx)
						return d, err
					}
				case <-time.After(10 * time.Second):
					res, err := a.Result(ctx)
					return 0, fmt.Errorf("%s: no delta within 10s (a bound, not a timing): %s %+v %v", id, res.State, res.Response, err)
				}
			}
		}
	}
	viaSSE := func(i int) (time.Duration, error) {
		id := fmt.Sprintf("ttft-sse-%d", i)
		resp, err := http.Get("http://" + w.StreamAddr() + "/v1/streams/" + id)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		t0 := time.Now()
		a, err := c.Start(ctx, id, in)
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "event: delta") {
				d := time.Since(t0)
				_, err := a.Result(ctx)
				return d, err
			}
		}
		return 0, fmt.Errorf("%s: no delta event (%v)", id, sc.Err())
	}
	// The gateway (docs/gateway.md): with its worker in its process
	// (sharing the Temporal client and the hub, eager start, as 'durallm
	// gateway' runs), and with the worker elsewhere ('--worker=false': a
	// Temporal client of its own, no shared hub, the stream found through
	// the attempt's first heartbeat and read from the worker's stream
	// endpoint over loopback HTTP).
	local := newBenchGateway(b, durallm.NewClient(tcl, "ttft").WithEagerStart(), w.Streams(), false)
	startWorkerProcess(b, st, "ttft-elsewhere")
	elsewhere := newBenchGateway(b, elsewhereClient(b, st, "ttft-elsewhere"), nil, true)
	viaGateway := func(g *benchGateway) func(int) (time.Duration, error) {
		return func(int) (time.Duration, error) { return g.ttft(ctx) }
	}
	viaAPI := func(g *benchGateway, api benchAPI) func(int) (time.Duration, error) {
		return func(int) (time.Duration, error) { return g.ttftOf(ctx, api) }
	}
	// Go runs each sub-benchmark more than once (b.N = 1 first); every
	// action id must be new.
	seq := 0
	fresh := func() int { seq++; return seq }
	for _, m := range []struct {
		name string
		run  func(int) (time.Duration, error)
	}{
		{"direct", direct},
		{"durable-sink", viaSink(c)},
		{"durable-sse", viaSSE},
		// The caller shares the worker's process and Temporal client, so
		// the first workflow task can come back with the start.
		{"durable-sink+eager-start", viaSink(durallm.NewClient(tcl, "ttft").WithEagerStart())},
		{"gateway", viaGateway(local)},
		{"gateway-messages", viaAPI(local, messagesAPI)},
		{"gateway-responses", viaAPI(local, responsesAPI)},
		{"gateway-worker-elsewhere", viaGateway(elsewhere)},
	} {
		b.Run(m.name, func(b *testing.B) {
			for range latencyWarmup {
				if _, err := m.run(fresh()); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				d, err := m.run(fresh())
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, d)
			}
			b.StopTimer()
			reportPercentiles(b, "ttft-", lat)
		})
	}
}
