package activities

import (
	"context"
	"strconv"
	"testing"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/codec/codectest"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/journal"
)

// BenchmarkCallModelJournal is the attempt journal's cost per attempt:
// the same happy attempt against the providertest provider over loopback
// TLS, without a journal, with the file-system one (a synced write and a
// synced rename per attempt) and with the PostgreSQL one (one INSERT ...
// ON CONFLICT, committed durably: the server here runs with fsync and
// synchronous_commit on), each in the clear and sealed with a keyring, in
// the same run.
//
//	go test -run '^$' -bench BenchmarkCallModelJournal -benchtime 2000x ./activities/
func BenchmarkCallModelJournal(b *testing.B) {
	var pg *pgserver.Server
	b.Cleanup(func() { pg.Stop() })
	postgres := func(keys *codec.Keyring) func(*testing.B) journal.Journal {
		return func(b *testing.B) journal.Journal {
			if pg == nil {
				var err error
				if pg, err = pgserver.Start(context.Background(), pgserver.Options{Durable: true}); err != nil {
					b.Fatal(err)
				}
			}
			j, err := journal.OpenPostgres(context.Background(), pg.DSN("bench"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(j.Close)
			j.Keys = keys
			return j
		}
	}
	keys := codectest.Ring(b, codectest.Line(b, "k1"))
	for _, tc := range []struct {
		name string
		j    func(*testing.B) journal.Journal
	}{
		{"none", func(*testing.B) journal.Journal { return nil }},
		{"dir", func(b *testing.B) journal.Journal { return journal.Dir{Path: b.TempDir()} }},
		{"dir-sealed", func(b *testing.B) journal.Journal { return journal.Dir{Path: b.TempDir(), Keys: keys} }},
		{"postgres", postgres(nil)},
		{"postgres-sealed", postgres(keys)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			a, _ := newActs(b)
			a.Journal = tc.j(b)
			in := attemptOn("openai", hello())
			b.ResetTimer()
			for i := range b.N {
				in.AttemptID = tc.name + "-" + strconv.Itoa(i)
				if out, err := a.CallModel(context.Background(), in); err != nil || out.Response == nil {
					b.Fatalf("attempt %d: %v", i, err)
				}
			}
		})
	}
}
