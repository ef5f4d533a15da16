package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// readyWriter collects output and reports the frontend address once
// 'dev' prints it.
type readyWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	re   *regexp.Regexp
	addr chan string
	sent bool
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if m := w.re.FindStringSubmatch(w.buf.String()); m != nil && !w.sent {
		w.sent = true
		w.addr <- m[1]
	}
	return len(p), nil
}

// TestDevDemonstrationEndToEnd runs 'durallm dev' headless on free ports
// over a fresh data directory: the embedded server, the worker, the demo
// provider and the demonstration. Then it restarts 'dev' over the same
// directory, finds the action the demonstration left awaiting a verdict,
// reconciles it through the CLI and checks it ended reconciled.
func TestDevDemonstrationEndToEnd(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	code := dispatch([]string{"dev", "--headless", "--port", "-1", "--data-dir", dir, "--exit-after-demo"}, &out, &errOut)
	if code != exitOK {
		t.Fatalf("dev exited %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	for _, c := range demoCases {
		if !regexp.MustCompile(`\[ok\] demo-\d+-` + c.name + ` → ` + string(c.want)).MatchString(out.String()) {
			t.Errorf("demonstration did not show %s ending %s:\n%s", c.name, c.want, out.String())
		}
	}
	if !strings.Contains(out.String(), "fresh connection after GOAWAY last=") {
		t.Errorf("the GOAWAY recovery is not visible in the output:\n%s", out.String())
	}
	waiting := regexp.MustCompile(`(demo-\d+-ambiguous) awaits your verdict`).FindStringSubmatch(out.String())
	if waiting == nil {
		t.Fatalf("no action awaiting a verdict:\n%s", out.String())
	}

	// Restart over the same data directory; the waiting action is still
	// there, and a verdict finishes it.
	ctx, stopDev := context.WithCancel(context.Background())
	defer stopDev()
	devContext = func() context.Context { return ctx }
	defer func() { devContext = context.Background }()
	done := make(chan int, 1)
	var err2 bytes.Buffer
	ready := &readyWriter{re: regexp.MustCompile(`server ready at (\S+)`), addr: make(chan string, 1)}
	go func() {
		done <- dispatch([]string{"dev", "--headless", "--port", "-1", "--data-dir", dir, "--no-demo"}, ready, &err2)
	}()
	var addr string
	select {
	case addr = <-ready.addr:
	case code := <-done:
		t.Fatalf("second dev exited %d before it was ready: %s", code, err2.String())
	}
	var lst bytes.Buffer
	if code := dispatch([]string{"list", "--address", addr, "--state", "awaiting_reconciliation"}, &lst, &errOut); code != exitOK || !strings.Contains(lst.String(), waiting[1]) {
		t.Fatalf("list exited %d: %q does not include %s (%s)", code, lst.String(), waiting[1], errOut.String())
	}
	var rec bytes.Buffer
	if code := dispatch([]string{"reconcile", "--address", addr, "--id", waiting[1], "--attempt", "1", "--verdict", "completed", "--text", "found it"}, &rec, &errOut); code != exitOK {
		t.Fatalf("reconcile exited %d: %s", code, errOut.String())
	}
	var st bytes.Buffer
	if code := dispatch([]string{"status", "--address", addr, "--id", waiting[1]}, &st, &errOut); code != exitOK || !strings.Contains(st.String(), "reconciled") {
		t.Fatalf("status exited %d: %s", code, st.String())
	}
	stopDev()
	if code := <-done; code != exitOK {
		t.Fatalf("second dev exited %d: %s", code, err2.String())
	}
}
