// Package pgserver starts a real PostgreSQL server for the project's own
// tests and harnesses: initdb into a temporary directory, postgres on a
// loopback port, stopped and removed again by Stop. It uses the
// PostgreSQL binaries on PATH (postgres, initdb, pg_ctl, pg_isready), which these
// machines have (Debian's postgresql package otherwise).
//
// PostgreSQL refuses to run as root. When the caller is root, the server
// runs as the "postgres" user (runuser), and its directory is owned by
// that user; otherwise it runs as the caller.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
)

// ErrUnavailable is returned (wrapped) when the PostgreSQL binaries are
// not on PATH. Tests skip on it only when told to; CI machines have them.
var ErrUnavailable = errors.New("pgserver: PostgreSQL binaries (postgres, initdb, pg_ctl, pg_isready) not on PATH")

// Options configure Start. The zero value is usable.
type Options struct {
	// Dir is the parent of the data directory; empty is os.TempDir.
	Dir string
	// Port is the loopback port; 0 picks a free one.
	Port int
	// Durable keeps fsync on. Off by default: these servers hold test
	// data, and fsync dominates their cost on a shared disk.
	Durable bool
	// Settings are extra "name=value" server settings (postgres -c).
	Settings []string
}

// Server is a running PostgreSQL server.
type Server struct {
	// Host and Port are where it listens (loopback, TCP).
	Host string
	Port int
	// User is the superuser name, trusted on loopback with no password.
	User string
	// DataDir is the server's data directory.
	DataDir string

	root  string
	runAs string
	cmd   *exec.Cmd
	done  chan error
	log   string // the server's log file
	fresh atomic.Int64
}

// FreshDSN names a database on this server that no caller has been
// given before ("fresh_N"; it does not exist yet): a test's own database,
// which durallm's Open creates.
func (s *Server) FreshDSN() string {
	return s.DSN(fmt.Sprintf("fresh_%d", s.fresh.Add(1)))
}

// DSN is a libpq/pgx connection URL for database db on this server.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", s.User, net.JoinHostPort(s.Host, strconv.Itoa(s.Port)), db)
}

// Start runs initdb and starts the server, returning once it accepts
// connections. The caller must call Stop.
func Start(ctx context.Context, o Options) (*Server, error) {
	for _, bin := range []string{"postgres", "initdb", "pg_ctl", "pg_isready"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
	}
	runAs := ""
	if os.Geteuid() == 0 {
		runAs = "postgres"
	}
	root, err := os.MkdirTemp(o.Dir, "durallm-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	s := &Server{Host: "127.0.0.1", Port: o.Port, User: "postgres", DataDir: filepath.Join(root, "data"), root: root, runAs: runAs, log: filepath.Join(root, "postgres.log")}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(root)
		return nil, err
	}
	if runAs != "" {
		if err := chownTo(root, runAs); err != nil {
			return fail(err)
		}
	}
	if s.Port == 0 {
		if s.Port, err = freePort(); err != nil {
			return fail(err)
		}
	}
	initdb := s.command(ctx, "initdb", "-D", s.DataDir, "-U", s.User, "--auth=trust", "--encoding=UTF8", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgserver: initdb: %w\n%s", err, out))
	}
	args := []string{"-D", s.DataDir, "-h", s.Host, "-p", strconv.Itoa(s.Port), "-k", root, "-c", "max_connections=200"}
	if !o.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for _, kv := range o.Settings {
		args = append(args, "-c", kv)
	}
	// A file, not a pipe: under runuser the server is a grandchild, and a
	// pipe it holds open would keep Wait from returning.
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fail(fmt.Errorf("pgserver: %w", err))
	}
	defer logf.Close()
	// Not CommandContext: the server must outlive a start-up context and
	// end only by Stop.
	s.cmd = s.command(context.Background(), "postgres", args...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return fail(fmt.Errorf("pgserver: start postgres: %w", err))
	}
	s.done = make(chan error, 1)
	go func() { s.done <- s.cmd.Wait() }()
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitReady polls the port until the server accepts a TCP connection and
// a session (pg_isready).
func (s *Server) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	addr := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	for {
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("pgserver: postgres exited at start: %v\n%s", err, s.Log())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			// pg_isready exits 0 only once the server accepts sessions;
			// pg_ctl status already succeeds while it still answers
			// "the database system is starting up".
			st := s.command(ctx, "pg_isready", "-h", s.Host, "-p", strconv.Itoa(s.Port), "-U", s.User, "-d", "postgres", "-t", "1")
			if st.Run() == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgserver: postgres not ready on %s after 60s\n%s", addr, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server (fast shutdown: open sessions are ended) and
// removes its directory. It is safe to call more than once.
func (s *Server) Stop() error {
	if s == nil || s.cmd == nil {
		return nil
	}
	var err error
	select {
	case werr := <-s.done:
		s.done <- werr
	default:
		// pg_ctl signals the postmaster itself (runuser would not pass
		// a signal on); fast mode ends open sessions.
		stop := s.command(context.Background(), "pg_ctl", "stop", "-D", s.DataDir, "-m", "fast", "-w", "-t", "30")
		_ = stop.Run()
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
			err = errors.New("pgserver: postgres did not stop within 30s; killed")
		}
		s.done <- nil
	}
	if rerr := os.RemoveAll(s.root); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// Log is what the server printed so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if s.runAs == "" {
		return exec.CommandContext(ctx, name, args...)
	}
	path, err := exec.LookPath(name)
	if err != nil {
		path = name
	}
	return exec.CommandContext(ctx, "runuser", append([]string{"-u", s.runAs, "--", path}, args...)...)
}

func chownTo(dir, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("pgserver: running as root needs the %q user: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ForTests starts one server for a whole test binary, sets *s, runs m
// and stops the server: from TestMain, as
// os.Exit(pgserver.ForTests(m, &srv)). A server that cannot start fails
// the binary; it is not skipped.
func ForTests(m interface{ Run() int }, s **Server) int {
	srv, err := Start(context.Background(), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*s = srv
	code := m.Run()
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return max(code, 1)
	}
	return code
}
