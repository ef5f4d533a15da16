package pgserver_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/durallm/durallm/internal/pgserver"
)

func TestStartServesQueriesAndStopRemovesEverything(t *testing.T) {
	ctx := context.Background()
	s, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		s.Stop()
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE probe"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = 'probe'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("database probe: n=%d err=%v", n, err)
	}
	conn.Close(ctx)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.DataDir); !os.IsNotExist(err) {
		t.Fatalf("data directory left behind: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}
