//go:build !nodev

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/testsuite/providertest"
)

// runDemoProvider serves the providertest's fault-injecting provider on its
// own, for setups where the worker runs elsewhere (docker-compose).
func runDemoProvider(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("demo-provider", "[flags]", stderr)
	tlsAddr := fs.String("tls-addr", "127.0.0.1:8443", "TLS (h2) listen address; its self-signed certificate names only loopback")
	h2cAddr := fs.String("h2c-addr", "127.0.0.1:8080", "cleartext HTTP/2 (prior knowledge) listen address; routes reach it with http_version \"2\" (or a worker with --allow-h2c)")
	h1Addr := fs.String("http1-addr", "127.0.0.1:8081", "cleartext HTTP/1.1 listen address, as local model servers listen")
	h1TLSAddr := fs.String("http1-tls-addr", "127.0.0.1:8444", "HTTP/1.1 over TLS (ALPN http/1.1 only) listen address")
	model := fs.String("model", "demo-model", "model name echoed in answers")
	goawayEvery := fs.Int("goaway-every", 0, "send a GOAWAY above the boundary on every Nth request (0: never), to watch recovery")
	misdirectedEvery := fs.Int("misdirected-every", 0, "answer 421 to every Nth request (0: never)")
	rpm := fs.Int("rpm", 0, "requests per minute the provider executes; past it, 429 with Retry-After and x-ratelimit-* headers (0: no limit)")
	tpm := fs.Int("tpm", 0, "tokens per minute (a request's prompt estimate plus its max_tokens) the provider admits; past it, 429 (0: no limit)")
	maxConcurrent := fs.Int("max-concurrent", 0, "requests in progress at once; past it, 429 (0: no limit)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *goawayEvery < 0 || *misdirectedEvery < 0 || *rpm < 0 || *tpm < 0 || *maxConcurrent < 0 {
		fmt.Fprintln(stderr, "durallm demo-provider: --goaway-every, --misdirected-every, --rpm, --tpm and --max-concurrent must not be negative")
		return exitUsage
	}
	opts := []providertest.Option{providertest.WithListenAddrs(*tlsAddr, *h2cAddr), providertest.WithHTTP1ListenAddrs(*h1Addr, *h1TLSAddr), providertest.WithModel(*model)}
	for _, l := range []struct {
		n   int
		opt func(int) providertest.Option
	}{{*rpm, providertest.WithRequestsPerMinute}, {*tpm, providertest.WithTokensPerMinute}, {*maxConcurrent, providertest.WithMaxConcurrentRequests}} {
		if l.n > 0 {
			opts = append(opts, l.opt(l.n))
		}
	}
	p, err := providertest.NewProvider(opts...)
	if err != nil {
		fmt.Fprintf(stderr, "durallm demo-provider: %v\n", err)
		return exitError
	}
	defer p.Close()
	// A request that declares tools gets one tool call, then an answer.
	p.SetDefault(providertest.AnswerOrCallTool("ok"))
	var n atomic.Int64
	p.Script(func(providertest.Request) (providertest.Behavior, bool) {
		i := n.Add(1)
		switch {
		case *goawayEvery > 0 && i%int64(*goawayEvery) == 0:
			return providertest.GoAwayAbove(http2.ErrCodeNo), true
		case *misdirectedEvery > 0 && i%int64(*misdirectedEvery) == 0:
			return providertest.Misdirected(), true
		}
		return providertest.Behavior{}, false
	})
	fmt.Fprintf(stdout, "demo provider (OpenAI chat-completions shape): HTTP/2 on %s and %s, HTTP/1.1 on %s and %s; Ctrl-C stops\n", p.URL(), p.H2CURL(), p.HTTP1URL(), p.HTTP1TLSURL())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	fmt.Fprintf(stdout, "demo provider: %d requests, %d executed, %d refused by its rate limits\n", len(p.Received()), len(p.Processed()), p.RateLimited().Total())
	return exitOK
}
