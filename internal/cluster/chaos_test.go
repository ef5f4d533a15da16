package cluster

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/haproxy"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/workflows"
)

// A fault rate outside 0 to 1 is refused before a cluster is started for
// it.
func TestChaosOptionsRejectAFaultRateOutsideZeroToOne(t *testing.T) {
	for _, tt := range []struct {
		faults float64
		ok     bool
	}{{0, true}, {0.2, true}, {1, true}, {-0.1, false}, {1.5, false}} {
		if err := (ChaosOptions{Faults: tt.faults}).Validate(); (err == nil) != tt.ok {
			t.Errorf("Faults %g: Validate() = %v", tt.faults, err)
		}
	}
}

// The slowest action's line says how it ended and what each attempt was,
// so a run's long tail can be read without its logs.
func TestSlowestSaysWhatEachAttemptWas(t *testing.T) {
	s := Slowest{ID: "chaos-7", Took: 42 * time.Second, Result: workflows.ActionResult{Status: workflows.Status{State: workflows.StateReconciled, Attempts: []workflows.AttemptRecord{
		{N: 1, Route: "primary", Duration: 30 * time.Second, Classification: evidence.Classification{Class: evidence.Ambiguous, Reason: "worker_lost_mid_attempt"},
			Verdict: attempt.VerdictCompleted, VerdictBy: attempt.ByJournal},
	}}}}
	want := "chaos-7, 42s, reconciled; attempt 1 on primary ambiguous (worker_lost_mid_attempt) after 30s, verdict completed by journal"
	if got := s.String(); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	if !strings.HasPrefix((Slowest{ID: "chaos-1", Result: workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted}}}).String(), "chaos-1, 0s, completed") {
		t.Fatal("an action with no attempts")
	}
}

// With ProviderRecord, every worker reads deploy/routes.yaml with both
// routes keeping a provider record (the environment override), as an
// operator would turn it on for the compose stack.
func TestTheProviderRecordReachesEveryWorkersRoutes(t *testing.T) {
	root, err := findRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, record := range []bool{false, true} {
		c := &Cluster{o: Options{Root: root, Dir: t.TempDir(), ProviderRecord: record}, Nodes: []*Node{{N: 1, Frontend: "127.0.0.1:7233"}},
			ProviderProxy: &haproxy.Proxy{Addr: "127.0.0.1:8443"}, JournalDSN: "postgres://127.0.0.1/durallm"}
		w, err := c.newWorker(1)
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		for _, kv := range w.env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		cfg, err := routes.LoadConfig(filepath.Join(root, RoutesFile), func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range cfg.Routes {
			if got := r.ProviderRecord == routes.ProviderRecordStoredCompletions; got != record {
				t.Errorf("ProviderRecord %v: route %s keeps a record: %v", record, r.Name, got)
			}
		}
	}
}
