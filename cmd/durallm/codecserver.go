package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/codec"
)

// encryptionKeyHelp documents the --encryption-key flag every command
// that reads or writes payloads shares.
const encryptionKeyHelp = "payload encryption keys: file:/path or env:VAR holding 'keyid:base64key' lines, the first active (default $DURALLM_ENCRYPTION_KEY; empty: payloads unencrypted)"

// loadKeyring loads the keyring named by spec, or returns nil for "".
// Warnings (a key file others can read) go to stderr.
func loadKeyring(spec string, stderr io.Writer) (*codec.Keyring, error) {
	if spec == "" {
		return nil, nil
	}
	k, err := codec.LoadKeyring(spec, os.Getenv)
	if err != nil {
		return nil, err
	}
	for _, w := range k.Warnings {
		fmt.Fprintf(stderr, "durallm: warning: %s\n", w)
	}
	return k, nil
}

func runCodecServer(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("codec-server", "[--encryption-key SPEC] [flags]", stderr)
	key := fs.String("encryption-key", os.Getenv("DURALLM_ENCRYPTION_KEY"), encryptionKeyHelp)
	resultDir := fs.String("result-dir", envOr("DURALLM_RESULT_DIR", "durallm-results"), "the workers' result store, where payloads kept by reference are read from")
	dsn := fs.String("journal-dsn", os.Getenv("DURALLM_JOURNAL_DSN"), "a postgres:// URL: the result store is in PostgreSQL, not in --result-dir (default $DURALLM_JOURNAL_DSN)")
	addr := fs.String("addr", "127.0.0.1:8081", "listen address")
	var origins, namespaces listFlag
	fs.Var(&origins, "allow-origin", "a Temporal UI origin allowed to call it, e.g. http://127.0.0.1:8233 (repeatable)")
	fs.Var(&namespaces, "namespace", "only serve these namespaces (repeatable; default any)")
	tokenEnv := fs.String("token-env", "", "environment variable holding a bearer token callers must send (default: no token)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	k, err := loadKeyring(*key, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "durallm codec-server: %v\n", err)
		return exitUsage
	}
	cf := connFlags{resultDir: *resultDir, journalDSN: *dsn, keys: k, keysLoaded: true}
	opts := codec.HandlerOptions{AllowedOrigins: origins, AllowedNamespaces: namespaces,
		References: claimcheck.NewCodec(cf.results(), claimcheck.Options{})}
	if *tokenEnv != "" {
		if opts.AuthToken = os.Getenv(*tokenEnv); opts.AuthToken == "" {
			fmt.Fprintf(stderr, "durallm codec-server: %s is empty\n", *tokenEnv)
			return exitUsage
		}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "durallm codec-server: %v\n", err)
		return exitError
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: codec.Handler(k, opts), ReadHeaderTimeout: 5 * time.Second}
	what := "payloads by reference from " + *resultDir
	if *dsn != "" {
		what = "payloads by reference from PostgreSQL"
	}
	if k != nil {
		what += fmt.Sprintf(", decrypted (keys %v, active %s)", k.KeyIDs(), k.ActiveKeyID())
	}
	fmt.Fprintf(stdout, "codec server on http://%s (%s); point the UI's codec endpoint or 'temporal --codec-endpoint' here\n", ln.Addr(), what)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "durallm codec-server: %v\n", err)
		return exitError
	}
	return exitOK
}

// lateHandler serves a handler that is only known after the listener must
// exist (the dev UI's origin is known once its port is).
type lateHandler struct{ h atomic.Pointer[http.Handler] }

func (l *lateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := l.h.Load()
	if h == nil {
		http.Error(w, "starting", http.StatusServiceUnavailable)
		return
	}
	(*h).ServeHTTP(w, r)
}
