package activities

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/fleetlimit"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
)

// DefaultOutputTokens is the output an attempt counts against its
// route's tokens per minute, per choice, when its request bounds none
// (on an anthropic route, the adapter's own default, which it sends),
// as a budget counts it. The usage the provider reports settles it.
const DefaultOutputTokens = providers.DefaultOutputTokens

// attemptTokens is what an attempt counts against its route's tokens per
// minute before it is sent: its prompt's upper bound (the budget's,
// providers.Request.PromptTokenBound) plus its output bound per choice.
// sentBound is the output bound the request is sent with, which a
// provider counts against its limit whatever is generated (OpenAI counts
// max_tokens); zero when the request is sent with none.
func attemptTokens(req providers.Request, route routes.Route) (reserve, sentBound float64) {
	// A part nothing bounds (a file) counts what the rest does; the
	// usage settles the difference.
	prompt, _ := req.PromptTokenBound(route.ImageTokens)
	out, set := req.MaxOutputTokens()
	switch {
	case set:
	case route.Kind == routes.KindAnthropic:
		out, set = providers.AnthropicMaxTokens, true
	default:
		out = DefaultOutputTokens
	}
	n := float64(req.Choices())
	if set {
		sentBound = float64(out) * n
	}
	return float64(prompt) + float64(out)*n, sentBound
}

// usedTokens is what an attempt counts once the provider reported its
// usage: its prompt and completion tokens, and never less output than
// the bound it was sent with.
func usedTokens(u providers.Usage, sentBound float64) float64 {
	return float64(u.PromptTokens) + max(float64(u.CompletionTokens), sentBound)
}

// capacity is one attempt's place under its route's fleet-wide limits.
type capacity struct {
	grant     *fleetlimit.Grant
	ev        *evidence.Capacity
	sentBound float64
	// waiting is the limit the attempt waits for, for its heartbeats;
	// empty once it has room.
	waiting atomic.Pointer[string]
}

// stage is the heartbeat's stage and limit while the attempt waits.
func (c *capacity) stage() (string, string) {
	if c == nil {
		return "", ""
	}
	if w := c.waiting.Load(); w != nil && *w != "" {
		return attempt.StageWaitingForCapacity, *w
	}
	return "", ""
}

// awaitCapacity waits for room for the attempt under its route's limits,
// before anything is sent, and records in c how long it took. ok is false
// when the attempt must not be sent: no room within what the deadline
// leaves (Capacity.NoRoom), or the wait was cut short, when ended is the
// context that ended it: ctx, or one ended at once when the worker
// begins to stop (nothing sent, nothing to finish within the grace: the
// next attempt goes to another worker).
func (a *Activities) awaitCapacity(ctx context.Context, in attempt.Input, route routes.Route, c *capacity) (ok bool, ended context.Context) {
	reserve, sentBound := attemptTokens(in.Request, route)
	c.sentBound = sentBound
	maxWait := a.capacityWait(ctx, in)
	if activity.IsActivity(ctx) {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		stopping := activity.GetWorkerStopChannel(ctx)
		go func() {
			select {
			case <-stopping:
				cancel(ErrWorkerStopping)
			case <-ctx.Done():
			}
		}()
	}
	start := time.Now()
	g, err := a.Limits.Acquire(ctx, in.Route, reserve, maxWait, func(limit string) { c.waiting.Store(&limit) })
	c.ev = &evidence.Capacity{Wait: time.Since(start)}
	if w := c.waiting.Swap(nil); w != nil {
		c.ev.Limit = *w // a wait cut short says what it waited for
	}
	var noRoom *fleetlimit.NoRoomError
	switch {
	case errors.As(err, &noRoom):
		c.ev.Limit, c.ev.NoRoom, c.ev.In = noRoom.Limit, true, noRoom.In
		return false, nil
	case err != nil:
		// Only ctx ends a wait otherwise: the scope, the worker's stop,
		// Temporal losing the attempt. Nothing was sent.
		return false, ctx
	}
	c.grant, c.ev.Wait, c.ev.Limit = g, g.Waited, g.Limit
	return true, nil
}

// capacityWait is how long this attempt may wait for room: what the
// workflow allowed from when it scheduled the attempt, less the time it
// spent in the task queue (both on Temporal's clock).
func (a *Activities) capacityWait(ctx context.Context, in attempt.Input) time.Duration {
	wait := in.CapacityWait
	if activity.IsActivity(ctx) {
		info := activity.GetInfo(ctx)
		if q := info.StartedTime.Sub(info.ScheduledTime); q > 0 {
			wait -= q
		}
	}
	return max(0, wait)
}

// release ends the attempt's place once its exchange has ended: room it
// provably did not use is given back, tokens settle at the usage the
// provider reported, and its place in flight is freed.
func (c *capacity) release(ev evidence.Evidence, usage providers.Usage) {
	if c == nil || c.grant == nil {
		return
	}
	// Anything the provider may have read counts: a 429 too.
	sent := ev.RequestSent || ev.MaybeSent || ev.Status != 0
	c.grant.Release(sent, usedTokens(usage, c.sentBound), usage.Reported())
}

// pushbackTap passes a provider's 429 to the limiter, which tightens the
// route's limits for the whole fleet before the attempt goes on.
type pushbackTap struct {
	rt    http.RoundTripper
	route string
	lim   *fleetlimit.Limiter
}

// pushbackTimeout bounds the tightening on the 429's way back.
const pushbackTimeout = time.Second

func (t pushbackTap) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		if p := fleetlimit.ReadPushback(resp.Header, time.Now()); p.Known() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), pushbackTimeout)
			t.lim.Pushback(ctx, t.route, p)
			cancel()
		}
	}
	return resp, err
}
