package devserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	"go.temporal.io/server/common/config"
	_ "modernc.org/sqlite" // the driver under the server's SQLite plugin
)

// openCached opens a file database in a temp dir through the statement
// cache, with one connection (as the server's plugin runs it).
func openCached(t *testing.T) *sql.DB {
	t.Helper()
	plain, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "t.db")+"?_pragma=journal_mode(wal)")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := connectorOf(plain)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(cachingConnector{inner: inner})
	applyPoolSettings(db, &config.SQL{})
	t.Cleanup(func() { _ = db.Close(); _ = plain.Close() })
	if _, err := db.Exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return db
}

// cacheOf reports the connection's cached statement count and how many it
// has prepared.
func cacheOf(t *testing.T, db *sql.DB) (cached, prepared int) {
	t.Helper()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Raw(func(dc any) error {
		cc, ok := dc.(*cachedConn)
		if !ok {
			return fmt.Errorf("connection is a %T", dc)
		}
		cached, prepared = len(cc.stmts), cc.prepared
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return cached, prepared
}

func TestTheStatementCacheReusesAPreparedStatement(t *testing.T) {
	db := openCached(t)
	_, before := cacheOf(t, db)
	for i := range 100 {
		if _, err := db.Exec("INSERT INTO t (k, v) VALUES (?, ?)", i, fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		var v string
		if err := db.QueryRow("SELECT v FROM t WHERE k = ?", i).Scan(&v); err != nil || v != fmt.Sprint("v", i) {
			t.Fatalf("row %d: %q, %v", i, v, err)
		}
	}
	if _, after := cacheOf(t, db); after-before != 2 {
		t.Fatalf("prepared %d statements for 2 texts run 100 times each", after-before)
	}
}

// A statement serves one result set at a time: the same text run again
// while its rows are still open (a transaction reading as it goes) must
// run apart, not reset the rows being read.
func TestAQueryRunWhileItsOwnRowsAreOpenRunsApart(t *testing.T) {
	db := openCached(t)
	for i := range 5 {
		if _, err := db.Exec("INSERT INTO t (k, v) VALUES (?, ?)", i, fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	const q = "SELECT k FROM t ORDER BY k"
	outer, err := tx.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for outer.Next() {
		var k int
		if err := outer.Scan(&k); err != nil {
			t.Fatal(err)
		}
		got = append(got, k)
		if k == 1 {
			var n int
			inner, err := tx.Query(q)
			if err != nil {
				t.Fatal(err)
			}
			for inner.Next() {
				n++
			}
			if err := errors.Join(inner.Err(), inner.Close()); err != nil || n != 5 {
				t.Fatalf("inner query: %d rows, %v", n, err)
			}
		}
	}
	if err := errors.Join(outer.Err(), outer.Close()); err != nil || fmt.Sprint(got) != "[0 1 2 3 4]" {
		t.Fatalf("outer query read %v, %v", got, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// Closed rows give the statement back: the next run reuses it.
	_, before := cacheOf(t, db)
	var n int
	if err := db.QueryRow("SELECT count(*) FROM (" + q + ")").Scan(&n); err != nil || n != 5 {
		t.Fatalf("count %d, %v", n, err)
	}
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	_ = rows.Close()
	if _, after := cacheOf(t, db); after-before != 1 {
		t.Fatalf("prepared %d statements, want 1 (the count; the query was cached)", after-before)
	}
}

// A failing statement returns the driver's error (the plugin tells
// duplicates by it) and stays usable.
func TestAFailedCachedStatementStaysUsable(t *testing.T) {
	db := openCached(t)
	const ins = "INSERT INTO t (k, v) VALUES (?, ?)"
	if _, err := db.Exec(ins, 1, "a"); err != nil {
		t.Fatal(err)
	}
	var dup interface{ Code() int }
	if _, err := db.Exec(ins, 1, "b"); !errors.As(err, &dup) {
		t.Fatalf("duplicate key: %v, want the driver's coded error", err)
	}
	if _, err := db.Exec(ins, 2, "c"); err != nil {
		t.Fatalf("after a failure: %v", err)
	}
	var v string
	if err := db.QueryRow("SELECT v FROM t WHERE k = ?", 1).Scan(&v); err != nil || v != "a" {
		t.Fatalf("row 1: %q, %v", v, err)
	}
}

func TestTheStatementCacheIsBounded(t *testing.T) {
	db := openCached(t)
	for i := range maxCachedStatements + 100 {
		// Each text differs (as an IN list of another length would).
		if _, err := db.Exec(fmt.Sprintf("INSERT INTO t (k, v) VALUES (?, '%d')", i), i); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil || n != maxCachedStatements+100 {
		t.Fatalf("%d rows, %v", n, err)
	}
	if cached, _ := cacheOf(t, db); cached > maxCachedStatements {
		t.Fatalf("%d statements cached, bound %d", cached, maxCachedStatements)
	}
}

func TestAnInMemoryDatabaseIsNotCached(t *testing.T) {
	_, err := newStatementCache(&config.SQL{DatabaseName: "x", ConnectAttributes: map[string]string{"mode": "memory"}}, serverLogger{l: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, errNotCacheable) {
		t.Fatalf("err %v, want errNotCacheable", err)
	}
}

// The cache reaches into two unexported fields (the plugin's handle and
// sql.DB's connector): a server or Go upgrade that moves either makes the
// devserver run uncached with a warning, and this test fails.
func TestTheStatementCacheIsInstalled(t *testing.T) {
	for _, off := range []bool{false, true} {
		s, err := Start(context.Background(), Options{DataDir: t.TempDir(), FrontendPort: FreePort, DisableUI: true, NoStatementCache: off, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if off {
			if s.stmtCache != nil {
				t.Error("NoStatementCache: a cache was installed")
			}
		} else {
			if s.stmtCache == nil {
				t.Fatal("no statement cache: the SQLite plugin's or database/sql's fields moved (see statementCache)")
			}
			xdb, err := sharedHandle(s.stmtCache.db)
			if err != nil {
				t.Fatal(err)
			}
			c, err := connectorOf(xdb.DB)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := c.(cachingConnector); !ok {
				t.Fatalf("the server's handle opens connections with a %T", c)
			}
		}
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}
