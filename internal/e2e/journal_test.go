package e2e_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// The journal unreachable: the action still completes on the embedded
// server, the journal's absence is reported (a warning per attempt; the
// telemetry counter beside it), and the worker never crashes.
func TestE2EJournalUnreachableTheActionStillCompletes(t *testing.T) {
	s := newStack(t)
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	s.startWorker(func(o *worker.Options) {
		o.Journal = journal.Dir{Path: filepath.Join(file, "journal")}
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	s.p.Push(providertest.Answer("answered without a journal"))
	res, err := s.run("no-journal", actionInput(false))
	if err != nil || res.State != workflows.StateCompleted || res.Response == nil || res.Response.Text != "answered without a journal" {
		t.Fatalf("state %s err %v response %+v", res.State, err, res.Response)
	}
	if out := logs.String(); !strings.Contains(out, "attempt journal unavailable") {
		t.Fatalf("the journal's absence was not reported; worker log:\n%s", out)
	}
}
