package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/fleetlimit"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// Two workers on one task queue keep a route's limits together in
// PostgreSQL, against a provider with the same limits of its own: a burst
// of actions larger than the provider's minute and its places in flight
// completes with no 429 reaching an attempt. The attempts that found no
// room waited for it instead, which is what the test makes them do.
func TestE2ETwoWorkersKeepTheProvidersLimitsWithout429s(t *testing.T) {
	const rpm, inFlight, actions = 30, 4, 40
	pg, err := pgserver.Start(context.Background(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	dsn := pg.FreshDSN()

	s := newStack(t)
	p, err := providertest.NewProvider(providertest.WithRequestsPerMinute(rpm), providertest.WithTokensPerMinute(200*rpm), providertest.WithMaxConcurrentRequests(inFlight))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetDefault(providertest.Answer("ok").After(20 * time.Millisecond))
	limited := routes.Config{Routes: []routes.Route{{
		Name: "limited", Kind: "openai", BaseURL: p.URL() + "/v1", Model: "m",
		Limits: &routes.Limits{RequestsPerMinute: rpm, TokensPerMinute: 200 * rpm, MaxConcurrentRequests: inFlight},
	}}}
	for range 2 {
		store, err := fleetlimit.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(store.Close)
		s.startWorker(func(o *worker.Options) {
			o.Config, o.TLS, o.LimitStore = limited, p.ClientTLSConfig(), store
		})
	}

	in := workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "say hello")},
			Params: map[string]json.RawMessage{"max_tokens": json.RawMessage("16")}},
		Routes: []string{"limited"},
	}
	results := make([]workflows.ActionResult, actions)
	errs := make([]error, actions)
	var wg sync.WaitGroup
	for i := range actions {
		wg.Go(func() { results[i], errs[i] = s.run(fmt.Sprintf("fleet-%d", i), in) })
	}
	wg.Wait()

	waited := map[string]int{}
	for i, res := range results {
		if errs[i] != nil || res.State != workflows.StateCompleted {
			t.Fatalf("action %d: %s (%s: %s), %v", i, res.State, res.Outcome, res.Reason, errs[i])
		}
		for _, a := range res.Attempts {
			if a.Classification.Class == evidence.Throttled {
				t.Fatalf("action %d: attempt %d was throttled (evidence %+v, capacity %+v); the provider's 429s: %+v", i, a.N, a.Evidence, a.Evidence.Capacity, p.RateLimited())
			}
			if c := a.Evidence.Capacity; c != nil && c.Limit != "" {
				waited[c.Limit]++
			}
		}
	}
	if got := p.RateLimited(); got.Total() != 0 {
		t.Fatalf("the provider answered %+v 429s", got)
	}
	if got := len(p.Received()); got != actions {
		t.Fatalf("the provider received %d requests for %d actions", got, actions)
	}
	// The burst was more than the provider's minute and its places: the
	// limits had to hold attempts back, or the test proved nothing.
	if waited[fleetlimit.LimitRequests] == 0 || waited[fleetlimit.LimitConcurrency] == 0 {
		t.Fatalf("attempts waited %v: the limits never held any back", waited)
	}
	t.Logf("attempts that waited, by limit: %v", waited)
}
