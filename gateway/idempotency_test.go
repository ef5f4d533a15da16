package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestIdempotencyKeyValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  string
		ok   bool
	}{
		{"one character", "a", true},
		{"a uuid", "stainless-python-retry-3f0b7a43-2a9e-4b4d-9d1c-0d5f1d2e6b7a", true},
		{"spaces and punctuation", "order 42: summary ~!", true},
		{"255 characters", strings.Repeat("k", 255), true},
		{"empty", "", false},
		{"256 characters", strings.Repeat("k", 256), false},
		{"a tab", "a\tb", false},
		{"a newline", "a\nb", false},
		{"DEL", "a\x7f", false},
		{"non-ASCII", "clé", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := validKey(tc.key); (err == nil) != tc.ok {
				t.Fatalf("validKey: %v, want ok %v", err, tc.ok)
			}
			if err := validKey(tc.key); err != nil && strings.Contains(err.Error(), tc.key) && tc.key != "" {
				t.Fatalf("the error quotes the key: %v", err)
			}
		})
	}
}

func TestKeyedActionIDs(t *testing.T) {
	a := keyedActionID("team-a", "k1")
	if a != keyedActionID("team-a", "k1") {
		t.Fatal("the same caller and key give two ids")
	}
	if len(a) != len("gw-")+32 || !strings.HasPrefix(a, "gw-") {
		t.Fatalf("id %q: want gw- and 32 hex digits", a)
	}
	for _, other := range []string{keyedActionID("team-b", "k1"), keyedActionID("team-a", "k2"),
		// The separator keeps ("ab", "c") and ("a", "bc") apart.
		keyedActionID("team-ak", "1")} {
		if other == a {
			t.Fatalf("two callers or keys share id %s", a)
		}
	}
	if strings.Contains(a, "k1") {
		t.Fatal("the id shows the key")
	}
	r1, r2 := randomActionID(), randomActionID()
	if r1 == r2 || len(r1) != len(a) || !strings.HasPrefix(r1, "gw-") {
		t.Fatalf("random ids %q %q", r1, r2)
	}
}

func TestCanonicalBody(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"keys sorted, whitespace gone", `{ "model": "m",
			"messages": [ {"role":"user", "content":"hi"} ] }`, `{"messages":[{"content":"hi","role":"user"}],"model":"m"}`},
		{"nested objects sorted", `{"b":{"z":1,"a":2},"a":0}`, `{"a":0,"b":{"a":2,"z":1}}`},
		{"stream and stream_options left out", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, `{"model":"m"}`},
		{"numbers as written", `{"temperature":0.70,"seed":12345678901234567890}`, `{"seed":12345678901234567890,"temperature":0.70}`},
		{"no HTML escaping", `{"content":"<a&b>"}`, `{"content":"<a&b>"}`},
		{"unicode kept", `{"content":"wörld \u00e9"}`, `{"content":"wörld é"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := canonicalBody([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	for _, bad := range []string{``, `null`, `[1]`, `"x"`, `{"a":1} {"b":2}`, `{"a":`} {
		if _, err := canonicalBody([]byte(bad)); err == nil {
			t.Errorf("canonicalBody(%q) accepted", bad)
		}
	}
}

func TestFingerprint(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	a, _ := fingerprint(secret, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	// The same request, streamed and written otherwise.
	b, _ := fingerprint(secret, []byte(`{"stream":true, "messages":[{"content":"hi","role":"user"}],"model":"m"}`))
	c, _ := fingerprint(secret, []byte(`{"model":"m","messages":[{"role":"user","content":"ho"}]}`))
	d, _ := fingerprint([]byte("another secret, also 32 bytes ok"), []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if a != b {
		t.Fatal("the same request streamed has another fingerprint")
	}
	if a == c || a == d {
		t.Fatal("another body or secret has the same fingerprint")
	}
	if len(a) != 64 {
		t.Fatalf("fingerprint %q: want 64 hex digits", a)
	}
}

// Two bodies that differ only in text that is not valid Unicode (a lone
// surrogate escape, a byte that is not UTF-8) have different
// fingerprints: decoding both to U+FFFD would let a different body reuse
// a key. Valid text keeps its canonical form, so no fingerprint of such a
// body changes.
func TestFingerprintsTellInvalidTextApart(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	bodies := []string{
		`{"content":"\ud800"}`,
		`{"content":"\ud801"}`,
		`{"content":"\udc00"}`,
		`{"content":"\ufffd"}`,
		"{\"content\":\"\xff\"}",
		"{\"content\":\"\xfe\"}",
		`{"content":"\\ud800"}`,
		`{"content":"x\ud800"}`,
	}
	seen := map[string]string{}
	for _, b := range bodies {
		fp, err := fingerprint(secret, []byte(b))
		if err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if other, ok := seen[fp]; ok {
			t.Errorf("%q and %q have the same fingerprint", b, other)
		}
		seen[fp] = b
	}
	// A valid surrogate pair is its character, written either way.
	a, _ := fingerprint(secret, []byte(`{"content":"\ud83d\ude00"}`))
	b, _ := fingerprint(secret, []byte(`{"content":"😀"}`))
	if a != b {
		t.Fatal("a surrogate pair and its character differ")
	}
}

// For valid text the canonical form is what encoding/json writes after
// decoding (object keys sorted, numbers as written, no HTML escaping):
// the fingerprints of keyed actions started before stay the same.
func TestCanonicalFormOfValidTextIsEncodingJSONs(t *testing.T) {
	byEncodingJSON := func(body []byte) string {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v map[string]any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		delete(v, "stream")
		delete(v, "stream_options")
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(out.String(), "\n")
	}
	var controls strings.Builder
	for c := 0; c < 0x20; c++ {
		fmt.Fprintf(&controls, `\u%04x`, c)
	}
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"z":1,"a":{"y":[1,2.50,-3e+7,{"b":null,"a":true}],"x":false},"m":"<a&b>"}`,
		`{"s":"` + controls.String() + `"}`,
		`{"s":"quote \" backslash \\ slash \/ tab \t nl \n"}`,
		`{"s":"\u2028\u2029 line separators, é \u00e9 😀 \ud83d\ude00 \ufffd"}`,
		`{"dup":1,"dup":2}`,
		`{"k\"ey":1,"k ey":2,"kéy":3,"k\u0001":4}`,
		`{"a":[],"b":{},"c":"","d":[[]],"e":[{}]}`,
		"{ \"a\" :\n [ 1 ,\t2 ] }",
	} {
		want := byEncodingJSON([]byte(body))
		got, err := canonicalBody([]byte(body))
		if err != nil || string(got) != want {
			t.Errorf("%s:\n got %s (%v)\nwant %s", body, got, err, want)
		}
	}
}
