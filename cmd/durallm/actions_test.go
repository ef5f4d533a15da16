package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/workflows"
)

// When `run --wait` gives up, a follow-up status query that fails (several
// clients giving up at once all query the action together) is retried:
// an action awaiting a verdict exits 7, as docs/cli.md promises, not 1.
func TestRunWaitExitsAwaitingWhenItsFirstStatusQueryFails(t *testing.T) {
	awaiting := workflows.Status{State: workflows.StateAwaitingReconciliation, AwaitingAttempt: 1}
	transient := errors.New("context deadline exceeded (query)")
	for _, tt := range []struct {
		name  string
		fails int   // status calls that fail before one succeeds
		err   error // what they fail with
		want  int
	}{
		{"the first query answers", 0, transient, exitAwaiting},
		{"two queries fail, the third answers", 2, transient, exitAwaiting},
		{"the action is gone: not retried", 1 << 30, durallm.ErrNotFound, exitError},
		{"no query ever answers", 1 << 30, transient, exitError},
	} {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			status := func(context.Context) (workflows.Status, error) {
				calls++
				if calls <= tt.fails {
					return workflows.Status{}, tt.err
				}
				return awaiting, nil
			}
			var stdout, stderr bytes.Buffer
			// The production retry, with its waits shortened.
			r := statusRetry
			r.first = time.Millisecond
			got := afterGivingUp(&stdout, &stderr, false, "act-1", errors.New("gave up"), status, r)
			if got != tt.want {
				t.Fatalf("exit %d, want %d; stderr %q", got, tt.want, stderr.String())
			}
			if errors.Is(tt.err, durallm.ErrNotFound) && calls != 1 {
				t.Fatalf("a missing action was queried %d times", calls)
			}
		})
	}
}

// The status says what an attempt's route limits did to it: how long it
// waited and for which limit, or that there was no room.
func TestStatusSaysWhatTheRouteLimitsDid(t *testing.T) {
	st := workflows.Status{ActionRef: "a1", State: workflows.StateCompleted, Used: 2, Budget: 4, Attempts: []workflows.AttemptRecord{
		{N: 1, Summary: "attempt 1 · primary · openai/m", Evidence: evidence.Evidence{Capacity: &evidence.Capacity{Wait: time.Millisecond, Limit: "tokens", NoRoom: true, In: time.Minute}},
			Classification: evidence.Classification{Class: evidence.Unsent, Reason: "fleet_limit_tokens"}},
		{N: 2, Summary: "attempt 2 · fallback · openai/n", Evidence: evidence.Evidence{Status: 200, Capacity: &evidence.Capacity{Wait: 3200 * time.Millisecond, Limit: "requests"}},
			Classification: evidence.Classification{Class: evidence.Completed, Reason: "response_complete"}},
	}}
	var b strings.Builder
	printStatus(&b, false, st)
	for _, want := range []string{"(fleet_limit_tokens) no_room=tokens", "status=200 waited=3.2s for=requests"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

// `durallm status` says which phase an action awaiting reconciliation is
// in: the worker's reconciler still looking, or a person awaited.
func TestStatusSaysWhetherTheReconcilerOrAPersonIsAwaited(t *testing.T) {
	for phase, want := range map[string]string{
		workflows.PhaseReconciler: "the worker's reconciler is still looking at it",
		workflows.PhasePerson:     "awaiting a verdict on attempt 1\n",
	} {
		var out bytes.Buffer
		printStatus(&out, false, workflows.Status{ActionRef: "act-1", State: workflows.StateAwaitingReconciliation, AwaitingAttempt: 1, AwaitingPhase: phase})
		if !strings.Contains(out.String(), want) {
			t.Errorf("phase %s: %q lacks %q", phase, out.String(), want)
		}
	}
}
