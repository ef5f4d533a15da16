//go:build !nodev

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// durallm worker --journal-dsn keeps the journal and the result store in
// PostgreSQL, encrypted with the payload keyring: an action whose answer
// is too large for history journals it and stores it in the database,
// and durallm run, given the same DSN and keys, prints the whole answer.
// The routes' fleet-wide limits are kept there too.
func TestWorkerKeepsJournalAndResultsInPostgres(t *testing.T) {
	ctx := context.Background()
	pg, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	srv, err := devserver.Start(ctx, devserver.Options{DataDir: t.TempDir(), FrontendPort: devserver.FreePort, DisableUI: true,
		SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	answer := strings.Repeat("a long answer ", 30_000) // 420 KB: over the 256 KiB threshold
	p.SetDefault(providertest.Answer(answer))

	dir := t.TempDir()
	routesFile := filepath.Join(dir, "routes.yaml")
	t.Setenv("DURALLM_TEST_KEY", "sk-test")
	if err := os.WriteFile(routesFile, []byte("routes:\n  - name: p\n    kind: openai\n    base_url: "+p.H2CURL()+"/v1\n    model: m\n    api_key_env: DURALLM_TEST_KEY\n    limits: {requests_per_minute: 600}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keyFile, []byte("k1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DURALLM_JOURNAL_DIR", "")
	t.Setenv("DURALLM_RESULT_DIR", "")
	dsn := pg.DSN("durallm")
	common := []string{"--address", srv.FrontendHostPort(), "--task-queue", "pgq", "--journal-dsn", dsn, "--encryption-key", "file:" + keyFile}

	wctx, stopWorker := context.WithCancel(ctx)
	workerContext = func() context.Context { return wctx }
	t.Cleanup(func() { workerContext = context.Background })
	var wout, werr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWorker(append([]string{"--routes", routesFile, "--metrics-addr", "", "--stream-addr", "", "--allow-h2c"}, common...), &wout, &werr)
	}()
	defer func() {
		stopWorker()
		if code := <-done; code != exitOK {
			t.Errorf("worker exited %d:\n%s", code, werr.String())
		}
		if !strings.Contains(werr.String(), "fleet-wide limits kept with every worker") {
			t.Errorf("the worker does not say where it keeps the limits:\n%s", werr.String())
		}
	}()

	var out, errOut bytes.Buffer
	if code := dispatch(append([]string{"run", "--id", "pg-action", "--route", "p", "--message", "hi", "--json"}, common...), &out, &errOut); code != exitOK {
		t.Fatalf("run exited %d: %s\nworker:\n%s", code, errOut.String(), werr.String())
	}
	var res workflows.ActionResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("run output: %v\n%.300s", err, out.String())
	}
	if res.Response == nil || res.Response.Text != answer || !strings.HasPrefix(res.ResultRef, "pg:") {
		t.Fatalf("result: ref %q, response %v", res.ResultRef, res.Response != nil)
	}

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var state string
	var entry []byte
	if err := conn.QueryRow(ctx, `SELECT state, entry FROM journal WHERE action_ref = 'pg-action'`).Scan(&state, &entry); err != nil {
		t.Fatal(err)
	}
	var stored []byte
	if err := conn.QueryRow(ctx, `SELECT data FROM results WHERE sha256 = $1`, strings.TrimPrefix(res.ResultRef, "pg:")).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	for what, b := range map[string][]byte{"journal entry": entry, "stored result": stored} {
		if !codec.Sealed(b) || bytes.Contains(b, []byte("long answer")) {
			t.Errorf("the %s is not sealed: %.60q", what, b)
		}
	}
	if state != "received" {
		t.Errorf("journal state %q", state)
	}
	// The route's limits are kept in the same database, for every worker
	// of the task queue.
	var limited int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM fleet_limits WHERE key = 'pgq/p'`).Scan(&limited); err != nil || limited != 1 {
		t.Errorf("the route's limits are not kept in the journal's database: %d rows, %v", limited, err)
	}
}
