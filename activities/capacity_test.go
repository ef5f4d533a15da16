package activities

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	sdktestsuite "go.temporal.io/sdk/testsuite"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/fleetlimit"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
)

// limitActs are newActs's activities with the openai route under limits,
// kept in store (one of the process's own when nil).
func limitActs(t *testing.T, store fleetlimit.Store, l routes.Limits) (*Activities, *providertest.Provider) {
	t.Helper()
	a, p := newActs(t)
	a.Limits = fleetlimit.New(fleetlimit.Options{Store: store, Routes: map[string]routes.Limits{"openai": l}})
	t.Cleanup(a.Limits.Close)
	return a, p
}

func nth(in attempt.Input, n int) attempt.Input {
	in.Attempt = n
	in.AttemptID = in.AttemptID + "-" + string(rune('0'+n))
	return in
}

// An attempt its route's limits have no room for within what its deadline
// leaves is never sent: unsent, with when the limit expects room, and
// never the provider's doing.
func TestAnAttemptWithNoRoomBeforeItsDeadlineIsNeverSent(t *testing.T) {
	a, p := limitActs(t, nil, routes.Limits{RequestsPerMinute: 1})
	in := attemptOn("openai", hello())
	out, err := a.CallModel(context.Background(), nth(in, 1))
	if err != nil || out.Classification.Class != evidence.Completed || out.Evidence.Capacity == nil || out.Evidence.Capacity.Limit != "" {
		t.Fatalf("first attempt %+v (capacity %+v), %v", out.Classification, out.Evidence.Capacity, err)
	}
	in2 := nth(in, 2)
	in2.CapacityWait = 10 * time.Second // less than the minute the bucket needs
	out, err = a.CallModel(context.Background(), in2)
	c := out.Classification
	if err != nil || c.Class != evidence.Unsent || c.Reason != "fleet_limit_requests" || c.ProviderHealth || c.RetryAfter < 50*time.Second {
		t.Fatalf("second attempt %+v, %v", c, err)
	}
	if cap := out.Evidence.Capacity; cap == nil || !cap.NoRoom || cap.Limit != fleetlimit.LimitRequests {
		t.Fatalf("capacity %+v", cap)
	}
	if n := len(p.Received()); n != 1 {
		t.Fatalf("the provider received %d requests, want the first alone", n)
	}
}

// A cancel that arrives while an attempt waits for room ends it there:
// canceled, and nothing is sent, then or later.
func TestAScopeEndingWhileAnAttemptWaitsForRoomSendsNothing(t *testing.T) {
	a, p := limitActs(t, nil, routes.Limits{RequestsPerMinute: 1})
	in := attemptOn("openai", hello())
	if _, err := a.CallModel(context.Background(), nth(in, 1)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in2 := nth(in, 2)
	in2.CapacityWait = time.Hour
	done := callInBackground(ctx, a, in2)
	time.AfterFunc(100*time.Millisecond, cancel) // the wait is a minute long
	out := <-done
	if out.Classification.Class != evidence.Canceled || out.Evidence.RequestSent || out.Evidence.Capacity == nil || out.Evidence.Capacity.Limit != fleetlimit.LimitRequests {
		t.Fatalf("outcome %+v, capacity %+v", out.Classification, out.Evidence.Capacity)
	}
	a.Engine.Close()
	if n := len(p.Received()); n != 1 {
		t.Fatalf("the provider received %d requests, want the first alone", n)
	}
}

// While it waits, an attempt's heartbeats say so and for which limit:
// that is what the Temporal UI shows of a pending attempt.
func TestAnAttemptWaitingForRoomHeartbeatsItsWait(t *testing.T) {
	a, _ := limitActs(t, nil, routes.Limits{MaxConcurrentRequests: 1})
	a.HeartbeatEvery = 20 * time.Millisecond
	held, err := a.Limits.Acquire(context.Background(), "openai", 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var s sdktestsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(a)
	var once sync.Once
	var stages []attempt.Progress
	var mu sync.Mutex
	env.SetOnActivityHeartbeatListener(func(_ *activity.Info, d converter.EncodedValues) {
		var p attempt.Progress
		_ = d.Get(&p)
		mu.Lock()
		stages = append(stages, p)
		mu.Unlock()
		if p.Stage == attempt.StageWaitingForCapacity {
			once.Do(func() { held.Release(true, 0, false) })
		}
	})
	in := attemptOn("openai", hello())
	in.CapacityWait = time.Hour
	v, err := env.ExecuteActivity(a.CallModel, in)
	if err != nil {
		t.Fatal(err)
	}
	var out attempt.Outcome
	if err := v.Get(&out); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stages) == 0 || stages[0].Stage != attempt.StageWaitingForCapacity || stages[0].CapacityLimit != fleetlimit.LimitConcurrency {
		t.Fatalf("heartbeats %+v", stages)
	}
	if out.Classification.Class != evidence.Completed || out.Evidence.Capacity == nil || out.Evidence.Capacity.Limit != fleetlimit.LimitConcurrency || out.Evidence.Capacity.Wait <= 0 {
		t.Fatalf("outcome %+v, capacity %+v", out.Classification, out.Evidence.Capacity)
	}
}

// A provider's 429 with a Retry-After tightens the route's limits for
// every worker sharing the store: another worker's next attempt waits
// it out instead of collecting a 429 of its own.
func TestAProviders429TightensTheRouteForEveryWorker(t *testing.T) {
	store := &fleetlimit.Memory{}
	a1, p := limitActs(t, store, routes.Limits{RequestsPerMinute: 6000})
	a2, _ := limitActs(t, store, routes.Limits{RequestsPerMinute: 6000})
	a2.Routes = a1.Routes // the same provider
	h := http.Header{}
	h.Set("Retry-After", "120")
	h.Set("X-Ratelimit-Remaining-Requests", "0")
	p.Push(providertest.Status(http.StatusTooManyRequests, h, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`))
	in := attemptOn("openai", hello())
	out, err := a1.CallModel(context.Background(), nth(in, 1))
	if err != nil || out.Classification.Class != evidence.Throttled {
		t.Fatalf("first attempt %+v, %v", out.Classification, err)
	}
	in2 := nth(in, 2)
	in2.CapacityWait = time.Minute
	out, err = a2.CallModel(context.Background(), in2)
	if err != nil || out.Classification.Reason != "fleet_limit_pushback" || out.Classification.RetryAfter < 100*time.Second {
		t.Fatalf("the other worker's attempt %+v, %v", out.Classification, err)
	}
	if n := len(p.Received()); n != 1 {
		t.Fatalf("the provider received %d requests, want one", n)
	}
}

// The tokens an attempt counts before it is sent (its prompt's bound and
// its output bound) settle at the usage the provider reports, so the
// next attempt has room at once; an output bound the request was sent
// with stays counted, as OpenAI counts max_tokens against its limit.
func TestUsageSettlesTheTokensAnAttemptCounted(t *testing.T) {
	for _, c := range []struct {
		name      string
		maxTokens int // 0: none sent
		want      string
	}{
		{"no bound sent: settled at the usage", 0, ""},
		{"a bound sent stays counted", 4000, "fleet_limit_tokens"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, _ := limitActs(t, nil, routes.Limits{TokensPerMinute: 5000})
			req := hello()
			if c.maxTokens > 0 {
				req.Params = map[string]json.RawMessage{providers.ParamMaxTokens: json.RawMessage("4000")}
			}
			in := attemptOn("openai", req)
			if out, err := a.CallModel(context.Background(), nth(in, 1)); err != nil || out.Classification.Class != evidence.Completed || out.Usage == nil {
				t.Fatalf("first attempt %+v, %v", out.Classification, err)
			}
			out, err := a.CallModel(context.Background(), nth(in, 2))
			if err != nil || out.Classification.Reason != orDefault(c.want, "response_complete") {
				t.Fatalf("second attempt %+v, %v", out.Classification, err)
			}
		})
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func TestAttemptTokens(t *testing.T) {
	withMax := hello()
	withMax.Params = map[string]json.RawMessage{providers.ParamMaxTokens: json.RawMessage("100"), "n": json.RawMessage("2")}
	prompt, _ := hello().PromptTokenBound(0)
	for _, c := range []struct {
		name          string
		req           providers.Request
		kind          string
		reserve, sent float64
	}{
		{"no bound: the default output, none sent", hello(), routes.KindOpenAI, float64(prompt + DefaultOutputTokens), 0},
		{"anthropic: the adapter's default, sent", hello(), routes.KindAnthropic, float64(prompt + 1024), 1024},
		{"the request's bound, per choice", withMax, routes.KindOpenAI, float64(prompt + 200), 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			reserve, sent := attemptTokens(c.req, routes.Route{Kind: c.kind})
			if reserve != c.reserve || sent != c.sent {
				t.Fatalf("attemptTokens = %v, %v; want %v, %v", reserve, sent, c.reserve, c.sent)
			}
		})
	}
	if got := usedTokens(providers.Usage{PromptTokens: 30, CompletionTokens: 4}, 200); got != 230 {
		t.Fatalf("usedTokens with a bound sent = %v", got)
	}
	if got := usedTokens(providers.Usage{PromptTokens: 30, CompletionTokens: 400}, 200); got != 430 {
		t.Fatalf("usedTokens past the bound = %v", got)
	}
}

// A worker that starts to stop ends the attempts still waiting for room
// at once, unsent, so another worker takes the action's next attempt:
// nothing was sent, and there is nothing to finish within the grace.
func TestAStoppingWorkerEndsAttemptsWaitingForRoomAtOnce(t *testing.T) {
	a, p := limitActs(t, nil, routes.Limits{RequestsPerMinute: 1})
	a.StopGrace = time.Hour
	in := attemptOn("openai", hello())
	if _, err := a.CallModel(context.Background(), nth(in, 1)); err != nil {
		t.Fatal(err)
	}
	var s sdktestsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(a)
	stopping := make(chan struct{})
	env.SetWorkerStopChannel(stopping)
	in2 := nth(in, 2)
	in2.CapacityWait = time.Hour
	done := make(chan attempt.Outcome, 1)
	go func() {
		var out attempt.Outcome
		v, err := env.ExecuteActivity(a.CallModel, in2)
		if err == nil {
			err = v.Get(&out)
		}
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	time.Sleep(100 * time.Millisecond) // the wait is a minute long
	close(stopping)
	select {
	case out := <-done:
		if c := out.Classification; c.Class != evidence.Unsent || c.Reason != "worker_stopped_before_send" || c.ProviderHealth {
			t.Fatalf("outcome %+v", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt still waits for room after its worker began to stop")
	}
	if n := len(p.Received()); n != 1 {
		t.Fatalf("the provider received %d requests", n)
	}
}
