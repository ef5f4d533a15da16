package journal_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/internal/pgdb"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/journal/journaltest"
	"github.com/durallm/durallm/providers"
)

// pg is one real PostgreSQL server for the whole test binary; each test
// gets a database of its own on it.
var pg *pgserver.Server

func TestMain(m *testing.M) { os.Exit(pgserver.ForTests(m, &pg)) }

func openPostgres(t *testing.T) *journal.Postgres {
	t.Helper()
	j, err := journal.OpenPostgres(context.Background(), pg.FreshDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	return j
}

func TestPostgres(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) journal.Journal { return openPostgres(t) })
}

// Two workers starting at once against a server without the database
// both end up with one database and one migrated schema.
func TestPostgresTwoWorkersStartingAtOnceMigrateOnce(t *testing.T) {
	dsn := pg.FreshDSN()
	var wg sync.WaitGroup
	js := make([]*journal.Postgres, 4)
	errs := make([]error, 4)
	for i := range js {
		wg.Add(1)
		go func() {
			defer wg.Done()
			js[i], errs[i] = journal.OpenPostgres(context.Background(), dsn)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
		defer js[i].Close()
	}
	ctx := context.Background()
	if err := js[0].Record(ctx, journal.Entry{AttemptID: "r-1", State: journal.Received, Response: &providers.Response{Text: "x"}}); err != nil {
		t.Fatal(err)
	}
	if e, ok, err := js[3].Lookup(ctx, "r-1"); err != nil || !ok || e.Response.Text != "x" {
		t.Fatalf("another worker's entry: %+v %v %v", e, ok, err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n, v int
	if err := conn.QueryRow(ctx, `SELECT count(*), max(version) FROM schema_version`).Scan(&n, &v); err != nil || n != pgdb.Version() || v != pgdb.Version() {
		t.Fatalf("schema_version: %d rows, version %d, err %v", n, v, err)
	}
	// Opening again migrates nothing and loses nothing.
	again, err := journal.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, ok, _ := again.Lookup(ctx, "r-1"); !ok {
		t.Fatal("reopening lost the entry")
	}
}

// A DSN that names no database uses durallm's own, "durallm".
func TestPostgresDefaultDatabaseIsDurallm(t *testing.T) {
	dsn := strings.Replace(pg.DSN("x"), "/x?", "/?", 1)
	j, err := journal.OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	conn, err := pgx.Connect(context.Background(), pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_database WHERE datname = 'durallm'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("database durallm: %d, %v", n, err)
	}
}

// A database that cannot be reached is an error naming the address, with
// the cause; the password never appears.
func TestPostgresUnreachableNamesTheAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a closed port: nothing listens there
	_, err = journal.OpenPostgres(context.Background(), "postgres://durallm:s3cret@"+addr+"/durallm?sslmode=disable&connect_timeout=5")
	if !errors.Is(err, pgdb.ErrUnreachable) || !strings.Contains(err.Error(), addr) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("err = %v", err)
	}
	if ce := (*pgconn.ConnectError)(nil); !errors.As(err, &ce) {
		t.Fatalf("the cause is not wrapped: %v", err)
	}
}

func TestPostgresSealed(t *testing.T) {
	journaltest.RunSealed(t, func(t *testing.T) journaltest.Storage {
		dsn := pg.FreshDSN()
		return journaltest.Storage{
			Open: func(t *testing.T, keys *codec.Keyring) journal.Journal {
				j, err := journal.OpenPostgres(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(j.Close)
				j.Keys = keys
				return j
			},
			Raw: func(t *testing.T, id string) []byte {
				conn, err := pgx.Connect(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(context.Background())
				// The whole row, as text: no column may hold the answer.
				var row string
				if err := conn.QueryRow(context.Background(), `SELECT j::text FROM journal j WHERE attempt_id = $1`, id).Scan(&row); err != nil {
					t.Fatal(err)
				}
				var b []byte
				if err := conn.QueryRow(context.Background(), `SELECT entry FROM journal WHERE attempt_id = $1`, id).Scan(&b); err != nil {
					t.Fatal(err)
				}
				if strings.Contains(row, "secret") {
					t.Fatalf("the row holds the text: %s", row)
				}
				return b
			},
			Plant: func(t *testing.T, id string, raw []byte) {
				conn, err := pgx.Connect(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(context.Background())
				if _, err := conn.Exec(context.Background(), `INSERT INTO journal (attempt_id, action_ref, state, entry) VALUES ($1, 'action-1', 'received', $2)
ON CONFLICT (attempt_id) DO UPDATE SET state = EXCLUDED.state, entry = EXCLUDED.entry`, id, raw); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}

func TestPostgresExpirable(t *testing.T) {
	journaltest.RunExpirable(t, func(t *testing.T, b *journal.Bound) journal.Expirable {
		j := openPostgres(t)
		j.Bound = b
		return j
	})
}

func TestPostgresWhileMeasuringFails(t *testing.T) {
	journaltest.RunWhileMeasuringFails(t, func(t *testing.T, b *journal.Bound) journal.Expirable {
		j := openPostgres(t)
		j.Bound = b
		return j
	}, journal.FailMeasuring)
}
