package activities

import (
	"context"
	"strconv"
	"testing"

	"github.com/durallm/durallm/journal"
)

// BenchmarkCallModelJournal is the attempt journal's cost per attempt:
// the same happy attempt against the providertest provider over loopback
// TLS, without a journal and with the file-system one (a synced write and
// a synced rename per attempt), in the same run.
//
//	go test -run '^$' -bench BenchmarkCallModelJournal -benchtime 2000x ./activities/
func BenchmarkCallModelJournal(b *testing.B) {
	for _, tc := range []struct {
		name string
		j    func(*testing.B) journal.Journal
	}{
		{"none", func(*testing.B) journal.Journal { return nil }},
		{"dir", func(b *testing.B) journal.Journal { return journal.Dir{Path: b.TempDir()} }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			a, _ := newActs(b)
			a.Journal = tc.j(b)
			in := attemptOn("openai", hello())
			b.ResetTimer()
			for i := range b.N {
				in.AttemptID = "bench-" + strconv.Itoa(i)
				if out, err := a.CallModel(context.Background(), in); err != nil || out.Response == nil {
					b.Fatalf("attempt %d: %v", i, err)
				}
			}
		})
	}
}
