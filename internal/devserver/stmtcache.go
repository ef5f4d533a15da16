package devserver

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"unsafe"

	"github.com/jmoiron/sqlx"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/metrics"
	persistencesql "go.temporal.io/server/common/persistence/sql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin"
	"go.temporal.io/server/common/resolver"
)

// maxCachedStatements bounds one connection's statement cache. The
// server's SQL persistence uses a few hundred distinct statements (an IN
// list of n values is its own text per n); at the bound the cache is
// emptied and refills, which costs what no cache costs, once.
const maxCachedStatements = 512

// errNotCacheable says the driver's connection or rows lack an interface
// the cache needs; the statement then runs uncached.
var errNotCacheable = errors.New("devserver: statement cache: driver lacks an interface")

// statementCache holds the SQLite store's shared handle with its
// connections wrapped in a prepared-statement cache, for as long as the
// server runs.
//
// Why: modernc.org/sqlite, the driver under the server's SQLite plugin,
// compiles every statement anew on every call (its conn.ExecContext and
// QueryContext prepare, run and finalize), and database/sql asks a
// driver that has those methods for nothing else. SQL compilation was
// about 15% of all the CPU an action costs on the embedded server
// (docs/performance.md "Where the CPU of an action goes"). The plugin
// hard-codes the driver name and keeps its handle unexported, so there
// is no option to hand it a caching driver; but every store of one
// server shares one *sqlx.DB per DSN (the plugin's connection pool, which
// keeps an entry while anyone holds a reference), and sqlx.DB's
// *sql.DB is an exported field. So the devserver takes the first
// reference, before the server starts, and replaces that *sql.DB with
// one whose connections cache their prepared statements.
//
// If a server upgrade moves either unexported field, installing fails
// with errNotCacheable and the devserver runs without the cache (and says
// so in its log); TestTheStatementCacheIsInstalled fails first.
type statementCache struct {
	db    sqlplugin.DB // the reference that keeps the pool entry alive
	once  sync.Once
	close error
}

// newStatementCache installs the cache on the plugin's shared handle for
// conf. The server must not have opened conf yet (nothing else may hold
// the handle while its *sql.DB is replaced).
func newStatementCache(conf *config.SQL, logger log.Logger) (*statementCache, error) {
	if conf.ConnectAttributes["mode"] == "memory" {
		// An in-memory database lives in its connections: replacing the
		// *sql.DB would close the one holding it.
		return nil, fmt.Errorf("%w: an in-memory database", errNotCacheable)
	}
	db, err := persistencesql.NewSQLDB(sqlplugin.DbKindMain, conf, resolver.NewNoopResolver(), logger, metrics.NoopMetricsHandler)
	if err != nil {
		return nil, fmt.Errorf("devserver: opening SQLite for the statement cache: %w", err)
	}
	xdb, err := sharedHandle(db)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	inner, err := connectorOf(xdb.DB)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	cached := sql.OpenDB(cachingConnector{inner: inner})
	applyPoolSettings(cached, conf)
	old := xdb.DB
	xdb.DB = cached
	_ = old.Close() // its one connection, opened by the plugin's ping
	return &statementCache{db: db}, nil
}

// applyPoolSettings gives the new handle the pool the plugin gives its
// own (createDBConnection in the plugin's plugin.go): the configured
// sizes, or one connection kept open.
func applyPoolSettings(db *sql.DB, conf *config.SQL) {
	db.SetMaxOpenConns(max(conf.MaxConns, 1))
	db.SetMaxIdleConns(max(conf.MaxIdleConns, 1))
	if conf.MaxConnLifetime > 0 {
		db.SetConnMaxLifetime(conf.MaxConnLifetime)
	}
}

// Close drops the devserver's reference; the plugin closes the handle
// once the server has dropped its own. It may be called more than once.
func (c *statementCache) Close() error {
	c.once.Do(func() { c.close = c.db.Close() })
	return c.close
}

// sharedHandle is the *sqlx.DB inside the plugin's db value.
func sharedHandle(db sqlplugin.DB) (*sqlx.DB, error) {
	v := reflect.ValueOf(db)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("%w: the SQLite plugin's db is a %T", errNotCacheable, db)
	}
	f := v.Elem().FieldByName("db")
	if !f.IsValid() || f.Type() != reflect.TypeOf((*sqlx.DB)(nil)) || f.IsNil() {
		return nil, fmt.Errorf("%w: the SQLite plugin's db has no *sqlx.DB field named db", errNotCacheable)
	}
	return (*sqlx.DB)(f.UnsafePointer()), nil
}

// connectorOf is the driver.Connector a *sql.DB opens its connections
// with (sql.DB keeps it unexported).
func connectorOf(db *sql.DB) (driver.Connector, error) {
	f := reflect.ValueOf(db).Elem().FieldByName("connector")
	if !f.IsValid() || f.Type() != reflect.TypeOf((*driver.Connector)(nil)).Elem() {
		return nil, fmt.Errorf("%w: sql.DB has no connector field", errNotCacheable)
	}
	c, _ := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(driver.Connector)
	if c == nil {
		return nil, fmt.Errorf("%w: sql.DB's connector is nil", errNotCacheable)
	}
	return c, nil
}

// cachingConnector opens the driver's connections and wraps each in a
// statement cache.
type cachingConnector struct{ inner driver.Connector }

func (c cachingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return newCachedConn(conn)
}

func (c cachingConnector) Driver() driver.Driver { return c.inner.Driver() }

// innerConn is what the cache needs of the driver's connection (modernc's
// conn has all of it).
type innerConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// cachedStmt is one prepared statement and whether rows from it are open
// (then the same text runs uncached, as a statement cannot serve two
// result sets at once).
type cachedStmt struct {
	stmt interface {
		driver.Stmt
		driver.StmtExecContext
		driver.StmtQueryContext
	}
	busy bool
}

// cachedConn is one connection with its statement cache. database/sql
// uses a connection from one goroutine at a time and closes rows under
// the same lock, so the mutex is never contended; it is there so that
// the cache stays sound if that ever changes.
type cachedConn struct {
	innerConn
	mu       sync.Mutex
	stmts    map[string]*cachedStmt
	prepared int // statements this connection has prepared for the cache
}

func newCachedConn(conn driver.Conn) (driver.Conn, error) {
	ic, ok := conn.(innerConn)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("%w: %T", errNotCacheable, conn)
	}
	return &cachedConn{innerConn: ic, stmts: make(map[string]*cachedStmt)}, nil
}

// take returns the cached statement for query, preparing it on first
// use, or nil when it cannot be used now (busy, or not cacheable).
func (c *cachedConn) take(ctx context.Context, query string) (*cachedStmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.stmts[query]; ok {
		if s.busy {
			return nil, nil
		}
		return s, nil
	}
	st, err := c.innerConn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	full, ok := st.(interface {
		driver.Stmt
		driver.StmtExecContext
		driver.StmtQueryContext
	})
	if !ok {
		_ = st.Close()
		return nil, nil
	}
	if len(c.stmts) >= maxCachedStatements {
		c.dropIdle()
	}
	s := &cachedStmt{stmt: full}
	c.stmts[query] = s
	c.prepared++
	return s, nil
}

// dropIdle closes every cached statement with no open rows.
func (c *cachedConn) dropIdle() {
	for q, s := range c.stmts {
		if !s.busy {
			_ = s.stmt.Close()
			delete(c.stmts, q)
		}
	}
}

func (c *cachedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	s, err := c.take(ctx, query)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return c.innerConn.ExecContext(ctx, query, args)
	}
	return s.stmt.ExecContext(ctx, args)
}

func (c *cachedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	s, err := c.take(ctx, query)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return c.innerConn.QueryContext(ctx, query, args)
	}
	rows, err := s.stmt.QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	typed, ok := rows.(innerRows)
	if !ok {
		// Not expected from modernc; still correct: the statement stays
		// busy until these rows close, through the plain wrapper's Close.
		typed = plainRows{rows}
	}
	c.mu.Lock()
	s.busy = true
	c.mu.Unlock()
	return &cachedRows{innerRows: typed, release: func() {
		c.mu.Lock()
		s.busy = false
		c.mu.Unlock()
	}}, nil
}

// Close finalizes the cached statements, then closes the connection.
func (c *cachedConn) Close() error {
	c.mu.Lock()
	var errs []error
	for q, s := range c.stmts {
		errs = append(errs, s.stmt.Close())
		delete(c.stmts, q)
	}
	c.mu.Unlock()
	errs = append(errs, c.innerConn.Close())
	return errors.Join(errs...)
}

// innerRows is what database/sql may ask of rows beyond driver.Rows
// (modernc's rows have all of it); a wrapper must pass it on or column
// types would silently change.
type innerRows interface {
	driver.Rows
	driver.RowsColumnTypeDatabaseTypeName
	driver.RowsColumnTypeLength
	driver.RowsColumnTypeNullable
	driver.RowsColumnTypePrecisionScale
	driver.RowsColumnTypeScanType
}

// cachedRows releases its statement when closed.
type cachedRows struct {
	innerRows
	once    sync.Once
	release func()
}

func (r *cachedRows) Close() error {
	err := r.innerRows.Close()
	r.once.Do(r.release)
	return err
}

// plainRows gives rows without column type information the answers
// database/sql would give them.
type plainRows struct{ driver.Rows }

func (plainRows) ColumnTypeDatabaseTypeName(int) string             { return "" }
func (plainRows) ColumnTypeLength(int) (int64, bool)                { return 0, false }
func (plainRows) ColumnTypeNullable(int) (bool, bool)               { return false, false }
func (plainRows) ColumnTypePrecisionScale(int) (int64, int64, bool) { return 0, 0, false }
func (plainRows) ColumnTypeScanType(int) reflect.Type               { return reflect.TypeFor[any]() }
