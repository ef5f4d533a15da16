package activities

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.temporal.io/api/serviceerror"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// An attempt Temporal lost track of while its connection was still being
// dialled ends there: unsent, journaled not_processed, and the provider
// never receives it, even once the stuck dial would have completed.
// Running on (the exchange detached from the start) sent it after the
// reconciler had already let the next attempt go.
func TestAnAttemptTemporalLostBeforeItsRequestLeftIsNeverSent(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	dialing, release := make(chan struct{}, 1), make(chan struct{})
	var d net.Dialer
	e := recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			select {
			case dialing <- struct{}{}:
			default:
			}
			// A network that stalls: the dial completes when released,
			// unless its context ends first.
			select {
			case <-release:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			return d.DialContext(context.Background(), network, addr)
		}})
	t.Cleanup(func() { e.Close(); p.Close() })
	a := &Activities{Engine: e, Journal: journal.Dir{Path: t.TempDir()}, Logger: slog.New(slog.DiscardHandler),
		Routes: map[string]routes.Route{"openai": {Name: "openai", Kind: routes.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m"}}}
	in := attemptOn("openai", hello())

	ctx, lose := context.WithCancelCause(context.Background())
	done := callInBackground(ctx, a, in)
	<-dialing
	lose(serviceerror.NewNotFound("activity task not found"))
	var out attempt.Outcome
	select {
	case out = <-done:
		close(release)
	case <-time.After(3 * time.Second): // below the engine's DialTimeout, so the stuck dial completes
		close(release)
		out = <-done
		t.Errorf("the attempt did not end when Temporal lost track of it before its request left")
	}
	if out.Classification.Class != evidence.Unsent || out.Classification.Reason != "temporal_lost_before_send" ||
		out.Evidence.Stop != evidence.StopTemporalLost || out.Classification.ProviderHealth {
		t.Errorf("classified %+v, stop %q", out.Classification, out.Evidence.Stop)
	}
	if e, ok, err := a.Journal.Lookup(context.Background(), in.AttemptID); err != nil || !ok || e.State != journal.NotProcessed {
		t.Errorf("journal %+v ok %v err %v", e, ok, err)
	}
	// Nothing of the attempt is left to send it.
	e.Close()
	if n := len(p.Received()); n != 0 {
		t.Fatalf("the provider received %d requests of an attempt the journal says it never processed", n)
	}
}

// callInBackground runs CallModel on a goroutine of its own; its outcome
// arrives on the channel.
func callInBackground(ctx context.Context, a *Activities, in attempt.Input) <-chan attempt.Outcome {
	done := make(chan attempt.Outcome, 1)
	go func() {
		out, _ := a.CallModel(ctx, in)
		done <- out
	}()
	return done
}
