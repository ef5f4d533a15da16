// Package demo is the demonstration 'durallm dev' runs, and the cluster
// harness too (internal/cluster): five actions, each showing one thing the
// contract promises (an answer, a GOAWAY recovered, a 421 retried, an
// ambiguous attempt left for a verdict, a cancellation), which
// scripts/ui-check then finds in the Temporal UI.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// Case is one action of the demonstration: what the provider does to
// its first request, and what the action should end as.
type Case struct {
	Name  string
	first func() providertest.Behavior // nil: answer normally
	Want  workflows.State
	note  string
}

var Cases = []Case{
	{"happy", nil, workflows.StateCompleted, "answered on the first attempt"},
	{"goaway", func() providertest.Behavior { return providertest.GoAwayAbove(http2.ErrCodeNo) }, workflows.StateCompleted, "GOAWAY above the boundary: provably unprocessed, resent on a fresh connection, executed once"},
	{"misdirected", providertest.Misdirected, workflows.StateCompleted, "421: connection quarantined, retried on a fresh one"},
	{"ambiguous", func() providertest.Behavior { return providertest.GoAwayAfterProcessing(http2.ErrCodeNo) }, workflows.StateAwaitingReconciliation, "GOAWAY at the boundary: maybe processed, so not resent; waits for your verdict"},
	{"canceled", providertest.Hold, workflows.StateCanceled, "canceled by user_stop while the provider was generating"},
}

// Options say where the demonstration runs.
type Options struct {
	// Routes the actions name, primary first.
	Routes []string
	// Frontend is the Temporal address printed in the reconcile commands.
	Frontend string
	// WorkflowURL links an action to its UI page; nil or "" prints none.
	WorkflowURL func(id string) string
}

// Run runs the demo actions one after another on c, whose workers' routes
// reach p directly, so each fault is easy to find in the UI, and prints
// what happened to each. It returns an error when one ends otherwise than
// its Case says.
func Run(ctx context.Context, out io.Writer, c *durallm.Client, p *providertest.Provider, o Options) error {
	prefix := "demo-" + time.Now().Format("150405")
	var mu sync.Mutex
	seen := map[string]bool{}
	byKey := map[string]Case{}
	for _, dc := range Cases {
		byKey[prefix+"-"+dc.Name] = dc
	}
	p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		defer mu.Unlock()
		dc, ok := byKey[r.IdempotencyKey]
		if !ok || dc.first == nil || seen[r.IdempotencyKey] {
			return providertest.Behavior{}, false
		}
		seen[r.IdempotencyKey] = true
		return dc.first(), true
	})
	fmt.Fprintf(out, "\nDemonstration (%d actions):\n", len(Cases))
	var ambiguous string
	for _, dc := range Cases {
		id := prefix + "-" + dc.Name
		st, err := runCase(ctx, c, p, id, dc, o.Routes)
		if err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		mark := "ok"
		if st.State != dc.Want {
			mark = "UNEXPECTED"
		}
		fmt.Fprintf(out, "\n  [%s] %s → %s: %s\n", mark, id, st.State, dc.note)
		for _, a := range st.Attempts {
			fmt.Fprintf(out, "        %s → %s (%s)\n", a.Summary, a.Classification.Class, a.Classification.Reason)
		}
		if u := workflowURL(o, id); u != "" {
			fmt.Fprintf(out, "        %s\n", u)
		}
		if st.State != dc.Want {
			return fmt.Errorf("%s ended %s, expected %s", id, st.State, dc.Want)
		}
		if dc.Want == workflows.StateAwaitingReconciliation {
			ambiguous = id
		}
	}
	if ambiguous != "" {
		fmt.Fprintf(out, "\n%s awaits your verdict. Resolve it with:\n", ambiguous)
		fmt.Fprintf(out, "  durallm reconcile --address %s --id %s --attempt 1 --verdict completed --text \"the answer, from the provider's log\"\n", o.Frontend, ambiguous)
		fmt.Fprintf(out, "or with the temporal CLI:\n")
		fmt.Fprintf(out, "  temporal workflow update execute --address %s --workflow-id %s --name reconcile --input '{\"attempt\":1,\"verdict\":\"not_executed\"}'\n", o.Frontend, ambiguous)
		fmt.Fprintf(out, "All actions awaiting a verdict: durallm list --address %s --state awaiting_reconciliation\n", o.Frontend)
	}
	return nil
}

func runCase(ctx context.Context, c *durallm.Client, p *providertest.Provider, id string, dc Case, routes []string) (workflows.Status, error) {
	in := workflows.ActionInput{
		Request:  providers.Request{Messages: []providers.Message{providers.TextMessage("user", "Say hello to the demo.")}},
		Routes:   routes,
		Deadline: 2 * time.Minute,
	}
	act, err := c.Start(ctx, id, in)
	if err != nil {
		return workflows.Status{}, err
	}
	switch dc.Want {
	case workflows.StateCanceled:
		if err := waitUntil(ctx, func() bool { return p.ExecutedCount(id) > 0 }); err != nil {
			return workflows.Status{}, err
		}
		if err := c.Cancel(ctx, id, workflows.OriginUserStop, "demo: the user pressed stop"); err != nil {
			return workflows.Status{}, err
		}
	case workflows.StateAwaitingReconciliation:
		var st workflows.Status
		err := waitUntil(ctx, func() bool {
			st, _ = c.Status(ctx, id)
			return st.State == workflows.StateAwaitingReconciliation || st.State.Terminal()
		})
		return st, err
	}
	res, err := act.Result(ctx)
	var ae *durallm.ActionError
	if err != nil && !errors.As(err, &ae) {
		return workflows.Status{}, err
	}
	return res.Status, nil
}

func waitUntil(ctx context.Context, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting: %w", context.Cause(ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

func workflowURL(o Options, id string) string {
	if o.WorkflowURL == nil {
		return ""
	}
	return o.WorkflowURL(id)
}
