package e2e_test

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providertest"
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
	var buf bytes.Buffer
	var mu sync.Mutex
	logs := &lockedBuffer{b: &buf, mu: &mu}
	s.startWorker(func(o *worker.Options) {
		o.Journal = journal.Dir{Path: filepath.Join(file, "journal")}
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	s.p.Push(providertest.Answer("answered without a journal"))
	res, err := s.run("no-journal", actionInput(false))
	if err != nil || res.State != workflows.StateCompleted || res.Response == nil || res.Response.Text != "answered without a journal" {
		t.Fatalf("state %s err %v response %+v", res.State, err, res.Response)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), "attempt journal unavailable") {
		t.Fatalf("the journal's absence was not reported; worker log:\n%s", buf.String())
	}
}
