package pgstore_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/internal/pgdb"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/resultstore/pgstore"
	"github.com/durallm/durallm/resultstore/storetest"
)

var pg *pgserver.Server

func TestMain(m *testing.M) { os.Exit(pgserver.ForTests(m, &pg)) }

func TestPostgres(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		dsn := pg.FreshDSN()
		s, err := pgstore.Open(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return storetest.Backend{Store: s, Scheme: pgstore.Scheme, Damage: func(t *testing.T, ref string) {
			conn, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(context.Background(), `UPDATE results SET data = 'tampered' WHERE sha256 = $1`, strings.TrimPrefix(ref, "pg:")); err != nil {
				t.Fatal(err)
			}
		}}
	})
}

// A client connects to the store a worker created and resolves its
// references; it creates nothing itself.
func TestClientConnectsToTheWorkersStore(t *testing.T) {
	ctx := context.Background()
	dsn := pg.FreshDSN()
	if _, err := pgstore.Connect(ctx, dsn); !errors.Is(err, pgdb.ErrUnreachable) {
		t.Fatalf("a client connected to a database no worker created: %v", err)
	}
	w, err := pgstore.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ref, err := w.Put(ctx, []byte("a long answer"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgstore.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.Get(ctx, ref); err != nil || string(got) != "a long answer" {
		t.Fatalf("client get: %q %v", got, err)
	}
	// A file reference is not this store's.
	if _, err := c.Get(ctx, resultstore.Ref("file", []byte("x"))); !errors.Is(err, resultstore.ErrBadRef) {
		t.Fatalf("file ref: %v", err)
	}
}

func TestPostgresSealed(t *testing.T) {
	storetest.RunSealed(t, func(t *testing.T) storetest.Storage {
		dsn := pg.FreshDSN()
		return storetest.Storage{
			Open: func(t *testing.T, keys *codec.Keyring) resultstore.Store {
				s, err := pgstore.Open(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				s.Keys = keys
				return s
			},
			Scheme: pgstore.Scheme,
			Raw: func(t *testing.T, ref string) []byte {
				conn, err := pgx.Connect(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(context.Background())
				var b []byte
				if err := conn.QueryRow(context.Background(), `SELECT data FROM results WHERE sha256 = $1`, strings.TrimPrefix(ref, "pg:")).Scan(&b); err != nil {
					t.Fatal(err)
				}
				return b
			},
		}
	})
}

func TestPostgresExpiry(t *testing.T) {
	storetest.RunExpiry(t, func(t *testing.T) storetest.Backend {
		dsn := pg.FreshDSN()
		s, err := pgstore.Open(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return storetest.Backend{Store: s, Scheme: pgstore.Scheme, StoreAsBeforeClaims: func(t *testing.T, data []byte) string {
			// The row alone, as Put wrote it before the claims migration.
			conn, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			ref := resultstore.Ref(pgstore.Scheme, data)
			if _, err := conn.Exec(context.Background(), `INSERT INTO results (sha256, data) VALUES ($1, $2)`, strings.TrimPrefix(ref, "pg:"), data); err != nil {
				t.Fatal(err)
			}
			return ref
		}}
	})
}
