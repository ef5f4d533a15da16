package resultstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDirRoundTripAndIdempotence(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "results")}
	ctx := context.Background()
	data := bytes.Repeat([]byte("answer "), 100000)
	ref, err := d.Put(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, "file:") || strings.Contains(ref, "answer") || strings.Contains(ref, d.Path) {
		t.Fatalf("ref %q", ref)
	}
	again, err := d.Put(ctx, data)
	if err != nil || again != ref {
		t.Fatalf("second put: %q %v", again, err)
	}
	got, err := d.Get(ctx, ref)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}
	entries, _ := os.ReadDir(d.Path)
	if len(entries) != 1 {
		t.Fatalf("%d files, want 1 (no temporaries left)", len(entries))
	}
}

func TestDirErrors(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	ctx := context.Background()
	for _, ref := range []string{"", "file:", "s3:abc", "file:../../etc/passwd", "file:" + strings.Repeat("z", 64)} {
		if _, err := d.Get(ctx, ref); !errors.Is(err, ErrBadRef) {
			t.Errorf("Get(%q) = %v, want ErrBadRef", ref, err)
		}
	}
	if _, err := d.Get(ctx, "file:"+strings.Repeat("a", 64)); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing ref: %v", err)
	}
	ref, err := d.Put(ctx, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(ref, "file:")
	if err := os.WriteFile(filepath.Join(d.Path, name), []byte("tampered"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(ctx, ref); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Errorf("tampered file: %v", err)
	}
}
