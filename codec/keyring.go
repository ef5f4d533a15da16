package codec

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// KeySize is the length in bytes every key must have after base64 decoding:
// AES-256.
const KeySize = 32

// maxKeyFileSize bounds how much of a key file is read; a real keyring is a
// few hundred bytes, so anything near this is a wrong path, not a keyring.
const maxKeyFileSize = 1 << 20

// keyIDPattern is what a key id may look like. Ids travel in payload
// metadata and in error messages, so they are kept short and printable.
var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Errors returned by LoadKeyring, matched with errors.Is. Line-level errors
// come wrapped in a *KeyLineError that says where.
var (
	// ErrKeySource means the spec is neither "file:<path>" nor "env:<NAME>",
	// or the file or variable could not be read.
	ErrKeySource = errors.New("invalid key source")
	// ErrNoKeys means the source held no key lines at all.
	ErrNoKeys = errors.New("no keys found")
	// ErrKeyLine means a line is not of the form "keyid:base64key".
	ErrKeyLine = errors.New(`malformed key line, want "keyid:base64key"`)
	// ErrKeyID means a key id does not match [A-Za-z0-9._-]{1,64}.
	ErrKeyID = errors.New("invalid key id, want 1 to 64 of [A-Za-z0-9._-]")
	// ErrKeyEncoding means the key is not valid standard or URL base64.
	ErrKeyEncoding = errors.New("key is not valid base64 (standard or URL alphabet)")
	// ErrKeyLength means the decoded key is not KeySize bytes long.
	ErrKeyLength = errors.New("key must be 32 bytes (AES-256) after base64 decoding")
	// ErrDuplicateKeyID means two lines use the same key id.
	ErrDuplicateKeyID = errors.New("duplicate key id")
)

// KeyLineError says which line of a key source is wrong. It never carries
// key material: KeyID is set only once the id itself has been validated.
type KeyLineError struct {
	// Source is the spec with any file path kept ("file:/etc/keys") or the
	// variable name ("env:DURALLM_KEYS"); never the contents.
	Source string
	// Line is 1-based. For env sources, entries separated by ";" count as
	// lines too.
	Line int
	// KeyID is the id on that line, or "" when the id is missing or invalid
	// (an invalid id might be key material pasted in the wrong order).
	KeyID string
	// Err is one of the Err* sentinels above, possibly joined with a detail.
	Err error
}

// Error implements error.
func (e *KeyLineError) Error() string {
	if e.KeyID != "" {
		return fmt.Sprintf("codec: %s line %d (key id %q): %v", e.Source, e.Line, e.KeyID, e.Err)
	}
	return fmt.Sprintf("codec: %s line %d: %v", e.Source, e.Line, e.Err)
}

// Unwrap lets errors.Is find the sentinel.
func (e *KeyLineError) Unwrap() error { return e.Err }

// Keyring holds one active key, used to encrypt, and any number of older
// keys that are still accepted for decryption so history written before a
// rotation stays readable.
//
// A Keyring is immutable after LoadKeyring and safe for concurrent use. It
// holds no raw key bytes, only the prepared ciphers, and its String and
// Format methods print ids only, so logging a Keyring by accident cannot
// leak a key.
type Keyring struct {
	// Warnings are non-fatal findings from loading, for the caller to log
	// (LoadKeyring itself never logs); for example a key file readable by
	// group or others. Nil when there are none.
	Warnings []string

	active string
	ids    []string // load order, active first
	aeads  map[string]cipher.AEAD
}

// ActiveKeyID returns the id of the key new payloads are encrypted with, or
// "" for a zero Keyring.
func (k Keyring) ActiveKeyID() string { return k.active }

// KeyIDs returns every key id in load order, the active one first. Ids are
// not secret and are safe to log.
func (k Keyring) KeyIDs() []string { return append([]string(nil), k.ids...) }

// String describes the keyring by ids only. Value receivers, here and on
// Format, cover a Keyring printed by value as well as by pointer.
func (k Keyring) String() string {
	return fmt.Sprintf("codec.Keyring{active: %q, keys: %d}", k.active, len(k.ids))
}

// Format makes every fmt verb (%v, %+v, %#v, %d, ...) print String, so no
// verb walks into the struct.
func (k Keyring) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, k.String()) }

// LoadKeyring reads keys from spec:
//
//   - "file:<path>": the file holds lines "keyid:base64key".
//   - "env:<NAME>": the variable holds the same lines, separated by newlines
//     or ";".
//
// The first key line is the active key; later lines are older keys kept for
// decryption. Blank lines and lines starting with "#" are ignored. Keys are
// KeySize bytes after decoding with the standard or URL base64 alphabet,
// padded or not. Key ids match [A-Za-z0-9._-]{1,64} and are unique.
//
// env looks variables up; nil means os.Getenv. A key file readable by group
// or others is accepted, with a note in Keyring.Warnings.
//
// Errors match the Err* sentinels with errors.Is, name the source, line and
// key id, and never contain key material or the contents of the source.
func LoadKeyring(spec string, env func(string) string) (*Keyring, error) {
	if env == nil {
		env = os.Getenv
	}
	var (
		text, source string
		warnings     []string
		sep          = "\n"
	)
	switch {
	case strings.HasPrefix(spec, "file:"):
		path := strings.TrimPrefix(spec, "file:")
		if path == "" {
			return nil, fmt.Errorf("codec: %w: empty path in file: spec", ErrKeySource)
		}
		source = "file:" + path
		data, mode, err := readKeyFile(path)
		if err != nil {
			return nil, fmt.Errorf("codec: %w: %w", ErrKeySource, err)
		}
		text = data
		if mode&0o044 != 0 {
			warnings = append(warnings, fmt.Sprintf(
				"key file %s is readable by group or others (mode %04o); chmod 600 it", path, mode))
		}
	case strings.HasPrefix(spec, "env:"):
		name := strings.TrimPrefix(spec, "env:")
		if name == "" {
			return nil, fmt.Errorf("codec: %w: empty variable name in env: spec", ErrKeySource)
		}
		source = "env:" + name
		text = env(name)
		// One-line variables are easier to set in most deployment tools.
		sep = "\n;"
	default:
		// The spec is deliberately not echoed: a key pasted where the spec
		// belongs must not end up in a log.
		return nil, fmt.Errorf(`codec: %w: want "file:<path>" or "env:<NAME>"`, ErrKeySource)
	}

	k, err := parseKeys(text, sep, source)
	if err != nil {
		return nil, err
	}
	k.Warnings = warnings
	return k, nil
}

// readKeyFile returns the file's contents and permission bits.
func readKeyFile(path string) (string, os.FileMode, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	if !st.Mode().IsRegular() {
		return "", 0, fmt.Errorf("%s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileSize+1))
	if err != nil {
		return "", 0, err
	}
	if len(data) > maxKeyFileSize {
		return "", 0, fmt.Errorf("%s is larger than %d bytes", path, maxKeyFileSize)
	}
	return string(data), st.Mode().Perm(), nil
}

// parseKeys turns the text of a key source into a Keyring. sep lists the
// characters that separate lines.
func parseKeys(text, sep, source string) (*Keyring, error) {
	k := &Keyring{aeads: make(map[string]cipher.AEAD)}
	firstLine := make(map[string]int)
	// Empty fields are kept so that "line N" is what an editor shows.
	lines := splitAny(text, sep)
	for i, raw := range lines {
		n := i + 1
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lineErr := func(id string, err error) error {
			return &KeyLineError{Source: source, Line: n, KeyID: id, Err: err}
		}
		id, enc, ok := strings.Cut(line, ":")
		id, enc = strings.TrimSpace(id), strings.TrimSpace(enc)
		if !ok || id == "" || enc == "" {
			return nil, lineErr("", ErrKeyLine)
		}
		if !keyIDPattern.MatchString(id) {
			return nil, lineErr("", ErrKeyID)
		}
		if _, err := decodeKey(id); err == nil {
			// A URL-base64 key fits the id alphabet; refusing it here keeps
			// a "base64key:keyid" line from printing the key as an id.
			return nil, lineErr("", fmt.Errorf("%w: the id decodes to a 32-byte key; is the line in keyid:base64key order?", ErrKeyID))
		}
		if prev, dup := firstLine[id]; dup {
			return nil, lineErr(id, fmt.Errorf("%w: first used on line %d", ErrDuplicateKeyID, prev))
		}
		key, err := decodeKey(enc)
		if err != nil {
			return nil, lineErr(id, err)
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, lineErr(id, fmt.Errorf("%w: %w", ErrKeyLength, err))
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, lineErr(id, err)
		}
		clear(key)
		firstLine[id] = n
		k.aeads[id] = aead
		k.ids = append(k.ids, id)
	}
	if len(k.ids) == 0 {
		return nil, fmt.Errorf("codec: %s: %w", source, ErrNoKeys)
	}
	k.active = k.ids[0]
	return k, nil
}

// splitAny splits s at every character in seps, keeping empty fields.
func splitAny(s, seps string) []string {
	var out []string
	for {
		i := strings.IndexAny(s, seps)
		if i < 0 {
			return append(out, s)
		}
		out = append(out, s[:i])
		s = s[i+1:]
	}
}

// keyEncodings are tried in order; padded and unpadded forms of both
// alphabets are accepted because key generators differ.
var keyEncodings = []*base64.Encoding{
	base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding,
}

// decodeKey decodes a base64 key and checks its length. Its errors carry no
// part of the input.
func decodeKey(s string) ([]byte, error) {
	for _, enc := range keyEncodings {
		b, err := enc.Strict().DecodeString(s)
		if err != nil {
			continue
		}
		if len(b) != KeySize {
			n := len(b)
			clear(b)
			return nil, fmt.Errorf("%w: got %d bytes", ErrKeyLength, n)
		}
		return b, nil
	}
	return nil, ErrKeyEncoding
}
