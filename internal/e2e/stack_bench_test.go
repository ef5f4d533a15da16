package e2e_test

import (
	"context"
	"github.com/durallm/durallm/providers/routes"
	"log/slog"
	"testing"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// serverStack is what the benchmarks here measure against: a file-backed
// embedded server, the providertest provider, a Temporal client and a
// durallm worker whose one route "r" points at the provider. Everything
// stops when the benchmark ends.
type serverStack struct {
	srv   *devserver.Server
	p     *providertest.Provider
	tc    client.Client
	w     *worker.Worker
	route routes.Route
}

// newServerStack starts a stack; server adjusts the server's options and
// wo the worker's (TaskQueue, TLS, Config, Logger and SearchAttributes
// are set here). The client is dialled with the server's ClientOptions,
// as 'durallm dev' does; clientOpts, if any, adjust them.
func newServerStack(b *testing.B, server func(*devserver.Options), wo worker.Options, clientOpts ...func(*client.Options)) *serverStack {
	b.Helper()
	so := devserver.Options{
		DataDir: b.TempDir(), FrontendPort: devserver.FreePort, DisableUI: true,
		SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler),
	}
	if server != nil {
		server(&so)
	}
	srv, err := devserver.Start(context.Background(), so)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Stop() })
	p, err := providertest.NewProvider()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	co := srv.ClientOptions()
	co.Logger = sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))
	for _, f := range clientOpts {
		f(&co)
	}
	tc, err := client.Dial(co)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(tc.Close)
	s := &serverStack{srv: srv, p: p, tc: tc,
		route: routes.Route{Name: "r", Kind: routes.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m", Capabilities: providers.Capabilities{Streaming: true}}}
	wo.TLS, wo.SearchAttributes, wo.Logger = p.ClientTLSConfig(), true, slog.New(slog.DiscardHandler)
	wo.Config = routes.Config{Routes: []routes.Route{s.route}}
	if s.w, err = worker.New(tc, wo); err != nil {
		b.Fatal(err)
	}
	if err := s.w.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.w.Stop)
	return s
}
