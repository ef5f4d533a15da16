package pgdb_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/durallm/durallm/internal/pgdb"
	"github.com/durallm/durallm/internal/pgserver"
)

var pg *pgserver.Server

func TestMain(m *testing.M) { os.Exit(pgserver.ForTests(m, &pg)) }

func exec(t *testing.T, db, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pg.DSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// A reader's Connect creates nothing: a database no worker migrated is
// ErrNoSchema, and stays unmigrated.
func TestConnectOnAnUnmigratedDatabaseIsErrNoSchema(t *testing.T) {
	exec(t, "postgres", "CREATE DATABASE bare")
	if _, err := pgdb.Connect(context.Background(), pg.DSN("bare")); !errors.Is(err, pgdb.ErrNoSchema) {
		t.Fatalf("Connect: %v", err)
	}
	pool, err := pgdb.Open(context.Background(), pg.DSN("bare"))
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	pool, err = pgdb.Connect(context.Background(), pg.DSN("bare"))
	if err != nil {
		t.Fatalf("Connect after a worker migrated: %v", err)
	}
	pool.Close()
}

// A schema newer than the worker is refused rather than used: this
// worker does not know what the newer one changed.
func TestOpenRefusesASchemaNewerThanItself(t *testing.T) {
	pool, err := pgdb.Open(context.Background(), pg.DSN("newer"))
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	exec(t, "newer", "INSERT INTO schema_version (version) VALUES (1000)")
	if _, err := pgdb.Open(context.Background(), pg.DSN("newer")); !errors.Is(err, pgdb.ErrSchemaNewer) {
		t.Fatal("opened a schema newer than this worker's")
	}
}

func TestABadDSNIsAnErrorWithoutThePassword(t *testing.T) {
	_, err := pgdb.Open(context.Background(), "postgres://u:s3cret@127.0.0.1:notaport/db")
	if err == nil || errors.Is(err, pgdb.ErrUnreachable) {
		t.Fatalf("err = %v", err)
	}
	if msg := err.Error(); strings.Contains(msg, "s3cret") {
		t.Fatalf("the error shows the password: %s", msg)
	}
}
