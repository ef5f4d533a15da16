package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/converter"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// recordSettle is the provider record's settle window in these tests.
const recordSettle = 2 * time.Second

// withProviderRecord gives the stack's routes stored completions.
func withProviderRecord(o *worker.Options) {
	for i := range o.Config.Routes {
		o.Config.Routes[i].ProviderRecord, o.Config.Routes[i].ProviderRecordSettle = routes.ProviderRecordStoredCompletions, recordSettle
	}
}

// killWhileGenerating starts action id on a worker process whose routes
// keep a provider record, waits until the provider is generating its
// answer (held at gate) and the worker has journaled the request as
// sent, SIGKILLs the worker, and lets a worker in this process take over.
func (s *stack) killWhileGenerating(id string, in workflows.ActionInput, b providertest.Behavior) {
	s.t.Helper()
	dir := s.t.TempDir()
	s.p.Push(b)
	cmd := s.helperWorker("DURALLM_HELPER_JOURNAL="+dir, "DURALLM_HELPER_PROVIDER_RECORD="+recordSettle.String())
	ctx := context.Background()
	if _, err := s.c.Start(ctx, id, in); err != nil {
		s.t.Fatal(err)
	}
	waitFor(s.t, func() bool { return s.p.ExecutedCount(id) == 1 })
	waitFor(s.t, func() bool {
		e, ok, _ := journal.Dir{Path: dir}.Lookup(ctx, entryID(s.t, dir))
		return ok && e.State == journal.Sent
	})
	if in.Request.Stream {
		// Content reached the worker, and its heartbeat told Temporal so.
		waitFor(s.t, func() bool {
			d, err := s.tc.DescribeWorkflowExecution(ctx, id, "")
			if err != nil || len(d.GetPendingActivities()) == 0 || d.GetPendingActivities()[0].GetHeartbeatDetails() == nil {
				return false
			}
			var p attempt.Progress
			return converter.GetDefaultDataConverter().FromPayloads(d.GetPendingActivities()[0].GetHeartbeatDetails(), &p) == nil && p.ContentStarted
		})
	}
	if err := cmd.Process.Kill(); err != nil {
		s.t.Fatal(err)
	}
	_ = cmd.Wait()
	s.startWorker(withProviderRecord, func(o *worker.Options) { o.Journal = journal.Dir{Path: dir} })
}

// A worker SIGKILLed while a provider-record route is generating: the
// provider stored what it generated, and the built-in reconciler settles
// the action with exactly that, by the provider, executed once, no person
// asked. Non-streamed, the attempt is ambiguous; streamed, with content
// already delivered, it is a partial committed on a lost worker, whose
// whole text the record holds.
func TestE2EWorkerKilledWhileGeneratingIsSettledFromTheProvidersRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a worker process")
	}
	for _, tc := range []struct {
		name   string
		stream bool
		class  evidence.Class
	}{
		{"non-streamed", false, evidence.Ambiguous},
		{"streamed, content delivered", true, evidence.CommittedPartial},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t)
			gate := make(chan struct{})
			defer close(gate)
			b := providertest.Answer("the answer the provider generated and kept").WaitFor(gate)
			if tc.stream {
				b = providertest.Answer("the answer the provider generated and kept").MidStreamWaitFor(gate)
			}
			id := "killed-generating-" + strings.Fields(tc.name)[0]
			s.killWhileGenerating(id, actionInput(tc.stream), b)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			res, err := s.c.Get(id).Result(ctx)
			if err != nil {
				t.Fatalf("err %v notes %v", err, res.Notes)
			}
			if res.State != workflows.StateReconciled || res.Response == nil || res.Response.Text != "the answer the provider generated and kept" || res.Response.FinishReason != "stop" {
				t.Fatalf("state %s response %+v notes %v", res.State, res.Response, res.Notes)
			}
			a := res.Attempts[0]
			if len(res.Attempts) != 1 || a.Classification.Class != tc.class || a.Verdict != attempt.VerdictCompleted || a.VerdictBy != attempt.ByProvider || a.ProviderRecord != attempt.ProviderRecordFound {
				t.Fatalf("attempts %+v", res.Attempts)
			}
			for _, n := range res.Notes {
				if strings.Contains(n.What, "could not tell") || strings.Contains(n.What, "via signal") || strings.Contains(n.What, "via update") {
					t.Fatalf("a person was asked: %v", res.Notes)
				}
			}
			if n := s.p.ExecutedCount(id); n != 1 {
				t.Fatalf("executed %d times", n)
			}
		})
	}
}

// With a store that lags longer than the settle window, the lookup finds
// nothing, which proves nothing: the action waits for a person, and the
// note says the lookup found nothing.
func TestE2EAStoreLaggingPastTheSettleWindowLeavesTheActionToAPerson(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a worker process")
	}
	s := newStack(t)
	s.p.SetStoreLag(time.Hour)
	gate := make(chan struct{})
	defer close(gate)
	in := actionInput(false)
	// A short attempt, so that the window ends soon after the kill.
	in.AttemptTimeout, in.QueueTimeout = 3*time.Second, time.Second
	s.killWhileGenerating("lagging-store", in, providertest.Answer("stored, not yet listed").WaitFor(gate))
	st := s.waitState("lagging-store", workflows.StateAwaitingReconciliation)
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for st.Attempts[0].ProviderRecord == "" && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		st, _ = s.c.Status(ctx, "lagging-store")
	}
	if st.State != workflows.StateAwaitingReconciliation || st.Attempts[0].ProviderRecord != attempt.ProviderRecordNotFound {
		t.Fatalf("state %s, provider record %q, notes %v", st.State, st.Attempts[0].ProviderRecord, st.Notes)
	}
	found := false
	for _, n := range st.Notes {
		found = found || (strings.Contains(n.What, "could not tell") && strings.Contains(n.What, "lookup found nothing") && strings.Contains(n.What, "not proof"))
	}
	if !found {
		t.Fatalf("no note says the lookup found nothing: %v", st.Notes)
	}
	if n := s.p.ExecutedCount("lagging-store"); n != 1 {
		t.Fatalf("executed %d times", n)
	}
	if err := s.c.Reconcile(ctx, "lagging-store", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAbandon}); err != nil {
		t.Fatal(err)
	}
}

// A person's verdict sent while the built-in reconciler is still looking
// (here, for the provider's record, over a ten-minute settle window) is
// applied at once: the status says the reconciler is looking, the
// Update is accepted, the reconcile activity is canceled, and the action
// ends with the person's verdict. Its history is recorded for the replay
// test.
func TestE2EAVerdictSentWhileTheReconcilerLooksIsAppliedAtOnce(t *testing.T) {
	s := newStack(t)
	s.startWorker(func(o *worker.Options) {
		for i := range o.Config.Routes {
			o.Config.Routes[i].ProviderRecord, o.Config.Routes[i].ProviderRecordSettle = routes.ProviderRecordStoredCompletions, 10*time.Minute
		}
	})
	s.p.Push(providertest.GoAwayAt(1, http2.ErrCodeNo, true).Unstored())
	// Far inside the settle window: the result comes from the verdict.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := s.c.Start(ctx, "verdict-while-looking", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	st := s.waitState("verdict-while-looking", workflows.StateAwaitingReconciliation)
	if st.AwaitingAttempt != 1 || st.AwaitingPhase != workflows.PhaseReconciler {
		t.Fatalf("while the reconciler looks: awaiting %d phase %q", st.AwaitingAttempt, st.AwaitingPhase)
	}
	waitFor(t, func() bool { return len(s.p.Received()) >= 2 }) // the attempt, and a lookup
	if err := s.c.Reconcile(ctx, "verdict-while-looking", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictCompleted, Response: &providers.Response{Text: "found in the provider's log"}, By: "test"}); err != nil {
		t.Fatal(err)
	}
	res, err := a.Result(ctx)
	if err != nil || res.State != workflows.StateReconciled || res.Response == nil || res.Response.Text != "found in the provider's log" || res.Attempts[0].VerdictBy != "person" {
		t.Fatalf("state %s err %v notes %v", res.State, err, res.Notes)
	}
	s.saveHistory("verdict-while-looking", "verdict_during_reconciler")
}

// A worker SIGKILLed while its built-in reconciler looks for the
// provider's record: the reconcile activity heartbeats, so Temporal runs
// it again on another worker within its heartbeat timeout, instead of
// after its start-to-close timeout (a minute, the attempt's time and the
// settle window: minutes), and that worker settles the action.
func TestE2EAReconcilerWhoseWorkerIsKilledRunsAgainOnAnotherWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a worker process")
	}
	s := newStack(t)
	// The record shows up 8 s after the provider started generating:
	// after the worker that first looks is killed.
	s.p.SetStoreLag(8 * time.Second)
	gate := make(chan struct{})
	defer close(gate)
	s.p.Push(providertest.Answer("the stored answer").WaitFor(gate))
	dir := t.TempDir()
	const settle = 2 * time.Minute
	cmd := s.helperWorker("DURALLM_HELPER_JOURNAL="+dir, "DURALLM_HELPER_PROVIDER_RECORD="+settle.String())
	in := actionInput(false)
	// The attempt times out while the provider generates: ambiguous.
	in.AttemptTimeout, in.QueueTimeout = 2*time.Second, time.Second
	// Well inside the reconciler's start-to-close timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := s.c.Start(ctx, "reconciler-killed", in)
	if err != nil {
		t.Fatal(err)
	}
	s.waitState("reconciler-killed", workflows.StateAwaitingReconciliation)
	waitFor(t, func() bool { return len(s.p.Received()) >= 2 }) // the attempt, and a lookup
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	s.startWorker(func(o *worker.Options) {
		o.Journal = journal.Dir{Path: dir}
		for i := range o.Config.Routes {
			o.Config.Routes[i].ProviderRecord, o.Config.Routes[i].ProviderRecordSettle = routes.ProviderRecordStoredCompletions, settle
		}
	})
	res, err := a.Result(ctx)
	if err != nil || res.State != workflows.StateReconciled || res.Response == nil || res.Response.Text != "the stored answer" || res.Attempts[0].VerdictBy != attempt.ByProvider {
		t.Fatalf("state %s err %v notes %v", res.State, err, res.Notes)
	}
}
