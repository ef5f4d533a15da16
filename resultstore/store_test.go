package resultstore_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/resultstore/storetest"
)

func TestDir(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		d := resultstore.Dir{Path: filepath.Join(t.TempDir(), "results")}
		return storetest.Backend{Store: d, Scheme: "file", Damage: func(t *testing.T, ref string) {
			if err := os.WriteFile(filepath.Join(d.Path, strings.TrimPrefix(ref, "file:")), []byte("tampered"), 0o600); err != nil {
				t.Fatal(err)
			}
		}}
	})
}

func TestDirLeavesOneFileAndNoPath(t *testing.T) {
	d := resultstore.Dir{Path: filepath.Join(t.TempDir(), "results")}
	data := bytes.Repeat([]byte("answer "), 1000)
	ref, err := d.Put(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ref, d.Path) {
		t.Fatalf("ref %q names the path", ref)
	}
	if _, err := d.Put(context.Background(), data); err != nil {
		t.Fatal(err)
	}
	// The result, and its hold under claims/: no temporaries left.
	var files []string
	if err := filepath.WalkDir(d.Path, func(path string, de os.DirEntry, err error) error {
		if err == nil && !de.IsDir() {
			files = append(files, strings.TrimPrefix(path, d.Path))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(ref, "file:")
	if len(files) != 2 || files[0] != "/"+name || files[1] != "/claims/"+name+"/held-for-no-action" {
		t.Fatalf("files %v, want the result and its hold (no temporaries left)", files)
	}
}

func TestDirSealed(t *testing.T) {
	storetest.RunSealed(t, func(t *testing.T) storetest.Storage {
		path := filepath.Join(t.TempDir(), "results")
		return storetest.Storage{
			Open: func(_ *testing.T, keys *codec.Keyring) resultstore.Store {
				return resultstore.Dir{Path: path, Keys: keys}
			},
			Scheme: "file",
			Raw: func(t *testing.T, ref string) []byte {
				b, err := os.ReadFile(filepath.Join(path, strings.TrimPrefix(ref, "file:")))
				if err != nil {
					t.Fatal(err)
				}
				return b
			},
		}
	})
}

func TestDirExpiry(t *testing.T) {
	storetest.RunExpiry(t, func(t *testing.T) storetest.Backend {
		d := resultstore.Dir{Path: filepath.Join(t.TempDir(), "results")}
		return storetest.Backend{Store: d, Scheme: "file", StoreAsBeforeClaims: func(t *testing.T, data []byte) string {
			// The file alone, as Put wrote it before claims were kept.
			ref := resultstore.Ref("file", data)
			if err := os.MkdirAll(d.Path, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d.Path, strings.TrimPrefix(ref, "file:")), data, 0o600); err != nil {
				t.Fatal(err)
			}
			return ref
		}}
	})
}
