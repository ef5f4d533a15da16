package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/workflows"
)

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// readyz returns /readyz's status code, 0 when it does not answer.
func readyz(addr string) int {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWorkerStartedBeforeTemporalWaitsAndRetries starts 'durallm worker'
// at an address where no Temporal server listens yet: it must say it is
// waiting and keep running, not exit. A real server then starts there,
// and /readyz turns 200; the server stops, and /readyz says the worker
// cannot reach Temporal (503) while the worker keeps running; a signal
// then ends it cleanly.
func TestWorkerStartedBeforeTemporalWaitsAndRetries(t *testing.T) {
	dir := t.TempDir()
	port := freeLoopbackPort(t)
	metrics := "127.0.0.1:" + strconv.Itoa(freeLoopbackPort(t))
	routesFile := filepath.Join(dir, "routes.yaml")
	// The route is never called: no action runs.
	if err := os.WriteFile(routesFile, []byte("routes:\n  - name: r\n    kind: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	workerContext = func() context.Context { return ctx }
	t.Cleanup(func() { workerContext = context.Background })

	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- dispatch([]string{"worker", "--address", "127.0.0.1:" + strconv.Itoa(port), "--routes", routesFile,
			"--metrics-addr", metrics, "--stream-addr", "", "--journal-dir", filepath.Join(dir, "journal"), "--result-dir", filepath.Join(dir, "results")}, &stdout, &stderr)
	}()
	running := func() bool {
		select {
		case code := <-done:
			t.Fatalf("the worker exited %d instead of waiting for Temporal:\n%s", code, stderr.String())
			return false
		default:
			return true
		}
	}
	eventually(t, "the worker to say it waits for Temporal", func() bool {
		return running() && strings.Contains(stderr.String(), "Temporal not reachable yet; retrying")
	})
	// Two tries at least: it retries, it does not just wait once.
	eventually(t, "a second try", func() bool { return running() && strings.Contains(stderr.String(), "try=2") })

	srv, err := devserver.Start(context.Background(), devserver.Options{
		DataDir: filepath.Join(dir, "temporal"), FrontendPort: port, DisableUI: true,
		SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			srv.Stop()
		}
	}()
	eventually(t, "/readyz 200 once Temporal is up", func() bool { return running() && readyz(metrics) == http.StatusOK })
	if !strings.Contains(stderr.String(), "Temporal is reachable now") {
		t.Errorf("the worker did not say it reached Temporal:\n%s", stderr.String())
	}

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	eventually(t, "/readyz 503 while Temporal is down", func() bool { return running() && readyz(metrics) == http.StatusServiceUnavailable })

	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("worker exited %d:\n%s", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("the worker did not stop on its context")
	}
}

func routesFile(t *testing.T) string {
	t.Helper()
	t.Setenv("DURALLM_TEST_KEY", "sk-test")
	f := filepath.Join(t.TempDir(), "routes.yaml")
	yaml := "routes:\n  - name: p\n    kind: openai\n    base_url: https://127.0.0.1:1/v1\n    model: m\n    api_key_env: DURALLM_TEST_KEY\n"
	if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// A worker told to keep its journal in a database it cannot reach does
// not start: it says where it tried, and exits 1.
func TestWorkerWithAnUnreachableJournalDSNDoesNotStart(t *testing.T) {
	t.Setenv("DURALLM_JOURNAL_DIR", "")
	t.Setenv("DURALLM_RESULT_DIR", "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a closed port
	var stdout, stderr bytes.Buffer
	code := runWorker([]string{"--routes", routesFile(t), "--metrics-addr", "", "--stream-addr", "",
		"--journal-dsn", "postgres://durallm:hunter2@" + addr + "/durallm?sslmode=disable&connect_timeout=5"}, &stdout, &stderr)
	if code != exitError || !strings.Contains(stderr.String(), addr) || !strings.Contains(stderr.String(), "cannot reach") ||
		strings.Contains(stderr.String(), "hunter2") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
}

// The journal is in one place: a DSN and a directory together are a
// usage error, whichever way the directory was given.
func TestWorkerJournalDSNAndDirTogetherIsAUsageError(t *testing.T) {
	dsn := "postgres://127.0.0.1:1/durallm"
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"journal-dir flag", []string{"--journal-dir", t.TempDir()}, nil},
		{"journal-dir env", nil, map[string]string{"DURALLM_JOURNAL_DIR": t.TempDir()}},
		{"result-dir flag", []string{"--result-dir", t.TempDir()}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("DURALLM_JOURNAL_DIR", "")
			t.Setenv("DURALLM_RESULT_DIR", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := runWorker(append([]string{"--routes", routesFile(t), "--journal-dsn", dsn}, tc.args...), &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), "set one") {
				t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
			}
		})
	}
}

func TestByteSizeFlag(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "512": 512, "64KiB": 64 << 10, "10GiB": 10 << 30, "3MiB": 3 << 20} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
		if in != "0" && b.String() != in {
			t.Errorf("String of %q = %q", in, b.String())
		}
	}
	for _, in := range []string{"", "-1", "1GB", "x", "9999999999GiB"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, b)
		}
	}
}
