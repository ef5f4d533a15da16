package codec

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// newKey returns 32 random bytes and their standard base64 form.
func newKey(t *testing.T) ([]byte, string) {
	t.Helper()
	b := make([]byte, KeySize)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b, base64.StdEncoding.EncodeToString(b)
}

// envOf serves a single variable to LoadKeyring.
func envOf(name, value string) func(string) string {
	return func(n string) string {
		if n == name {
			return value
		}
		return ""
	}
}

// mustKeyring loads a keyring from an in-memory variable.
func mustKeyring(t *testing.T, text string) *Keyring {
	t.Helper()
	k, err := LoadKeyring("env:KEYS", envOf("KEYS", text))
	if err != nil {
		t.Fatalf("LoadKeyring: %v", err)
	}
	return k
}

func writeFile(t *testing.T, text string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
	// WriteFile's mode is filtered by the umask; set it exactly.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// assertNoMaterial fails if any 8-character run of any secret appears in s.
// Eight characters of random base64 do not occur in prose by accident.
func assertNoMaterial(t *testing.T, s string, secrets ...string) {
	t.Helper()
	for _, sec := range secrets {
		for i := 0; i+8 <= len(sec); i++ {
			if strings.Contains(s, sec[i:i+8]) {
				t.Fatalf("key material %q... leaked into %q", sec[i:i+8], s)
			}
		}
	}
}

func TestLoadKeyring(t *testing.T) {
	raw1, k1 := newKey(t)
	raw2, k2 := newKey(t)
	_, k3 := newKey(t)
	urlKey := base64.RawURLEncoding.EncodeToString(raw2)
	shortKey := base64.StdEncoding.EncodeToString(raw1[:16])
	badKey := k3[:10] + "$" + k3[11:]
	secrets := []string{k1, k2, k3, urlKey, shortKey, badKey, string(raw1), string(raw2)}

	type want struct {
		active   string
		ids      []string
		warnings int
		err      error
		line     int    // for *KeyLineError; 0 = not a line error
		keyID    string // KeyLineError.KeyID
	}
	cases := []struct {
		name string
		spec string
		env  string      // value of KEYS for env: specs
		file string      // contents for file: specs ("@" in spec)
		mode os.FileMode // file mode, default 0600
		want want
	}{
		{
			name: "good file with comments, blank lines and CRLF",
			spec: "file:@",
			file: "# durallm keys\r\n\r\nnew:" + k2 + "\r\n  old.2024-01_a : " + k1 + "  \r\n",
			want: want{active: "new", ids: []string{"new", "old.2024-01_a"}},
		},
		{
			name: "file readable by others is a warning, not an error",
			spec: "file:@",
			file: "k1:" + k1 + "\n",
			mode: 0o644,
			want: want{active: "k1", ids: []string{"k1"}, warnings: 1},
		},
		{
			name: "env separated by semicolons",
			spec: "env:KEYS",
			env:  "k2:" + k2 + ";k1:" + k1,
			want: want{active: "k2", ids: []string{"k2", "k1"}},
		},
		{
			name: "env with newlines and unpadded URL base64",
			spec: "env:KEYS",
			env:  "\nu:" + urlKey + "\n",
			want: want{active: "u", ids: []string{"u"}},
		},
		{
			name: "bad base64",
			spec: "env:KEYS",
			env:  "k1:" + k1 + ";k3:" + badKey,
			want: want{err: ErrKeyEncoding, line: 2, keyID: "k3"},
		},
		{
			name: "wrong key length",
			spec: "file:@",
			file: "# one\nshort:" + shortKey + "\n",
			want: want{err: ErrKeyLength, line: 2, keyID: "short"},
		},
		{
			name: "duplicate id",
			spec: "env:KEYS",
			env:  "a:" + k1 + "\n\nb:" + k2 + "\na:" + k3,
			want: want{err: ErrDuplicateKeyID, line: 4, keyID: "a"},
		},
		{
			name: "bad id is not echoed",
			spec: "env:KEYS",
			env:  "bad/id:" + k1,
			want: want{err: ErrKeyID, line: 1},
		},
		{
			name: "id too long",
			spec: "env:KEYS",
			env:  strings.Repeat("x", 65) + ":" + k1,
			want: want{err: ErrKeyID, line: 1},
		},
		{
			name: "swapped order keeps the key out of the error",
			spec: "env:KEYS",
			env:  urlKey + ":k1",
			want: want{err: ErrKeyID, line: 1},
		},
		{
			name: "key without id",
			spec: "env:KEYS",
			env:  k1,
			want: want{err: ErrKeyLine, line: 1},
		},
		{
			name: "empty id",
			spec: "env:KEYS",
			env:  ":" + k1,
			want: want{err: ErrKeyLine, line: 1},
		},
		{
			name: "no keys, only comments",
			spec: "file:@",
			file: "# nothing yet\n\n",
			want: want{err: ErrNoKeys},
		},
		{
			name: "no keys, unset variable",
			spec: "env:UNSET",
			want: want{err: ErrNoKeys},
		},
		{
			name: "key pasted as spec is not echoed",
			spec: "k1:" + k1,
			want: want{err: ErrKeySource},
		},
		{
			name: "missing file",
			spec: "file:/nonexistent/durallm/keys",
			want: want{err: ErrKeySource},
		},
		{
			name: "empty env name",
			spec: "env:",
			want: want{err: ErrKeySource},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			if strings.Contains(spec, "@") {
				mode := tc.mode
				if mode == 0 {
					mode = 0o600
				}
				spec = strings.Replace(spec, "@", writeFile(t, tc.file, mode), 1)
			}
			k, err := LoadKeyring(spec, envOf("KEYS", tc.env))
			if tc.want.err != nil {
				if err == nil {
					t.Fatalf("LoadKeyring = %v, want error %v", k, tc.want.err)
				}
				if !errors.Is(err, tc.want.err) {
					t.Fatalf("error %q does not match %v", err, tc.want.err)
				}
				assertNoMaterial(t, err.Error(), secrets...)
				var le *KeyLineError
				if tc.want.line != 0 {
					if !errors.As(err, &le) {
						t.Fatalf("error %q is not a *KeyLineError", err)
					}
					if le.Line != tc.want.line || le.KeyID != tc.want.keyID {
						t.Fatalf("line %d key id %q, want line %d key id %q", le.Line, le.KeyID, tc.want.line, tc.want.keyID)
					}
					if !strings.Contains(err.Error(), fmt.Sprintf("line %d", tc.want.line)) {
						t.Fatalf("error %q does not name line %d", err, tc.want.line)
					}
					if tc.want.keyID != "" && !strings.Contains(err.Error(), tc.want.keyID) {
						t.Fatalf("error %q does not name key id %q", err, tc.want.keyID)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadKeyring: %v", err)
			}
			if got := k.ActiveKeyID(); got != tc.want.active {
				t.Errorf("active = %q, want %q", got, tc.want.active)
			}
			if got := k.KeyIDs(); fmt.Sprint(got) != fmt.Sprint(tc.want.ids) {
				t.Errorf("ids = %v, want %v", got, tc.want.ids)
			}
			if len(k.Warnings) != tc.want.warnings {
				t.Errorf("warnings = %q, want %d", k.Warnings, tc.want.warnings)
			}
			for _, w := range k.Warnings {
				assertNoMaterial(t, w, secrets...)
			}
		})
	}
}

func TestLoadKeyringDefaultsToProcessEnv(t *testing.T) {
	_, k1 := newKey(t)
	t.Setenv("DURALLM_CODEC_TEST_KEYS", "p:"+k1)
	k, err := LoadKeyring("env:DURALLM_CODEC_TEST_KEYS", nil)
	if err != nil {
		t.Fatal(err)
	}
	if k.ActiveKeyID() != "p" {
		t.Fatalf("active = %q", k.ActiveKeyID())
	}
}

func TestKeyringPrintsNoKeyMaterial(t *testing.T) {
	raw, enc := newKey(t)
	k := mustKeyring(t, "k1:"+enc)
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%q"} {
		for _, v := range []any{k, *k} {
			out := fmt.Sprintf(verb, v)
			decimal := strings.Trim(fmt.Sprint(raw[:4]), "[]") // how %d would show bytes
			if strings.Contains(out, string(raw)) || strings.Contains(out, fmt.Sprintf("%x", raw[:8])) ||
				strings.Contains(out, decimal) {
				t.Fatalf("%s printed key material: %s", verb, out)
			}
			if !strings.Contains(out, "k1") {
				t.Fatalf("%s = %q, want the key id", verb, out)
			}
		}
	}
	assertNoMaterial(t, fmt.Sprintf("%+v", k), enc)
}
