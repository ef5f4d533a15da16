package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
