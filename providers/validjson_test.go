package providers

import (
	"encoding/json"
	"strings"
	"testing"
)

// validJSONCases are the edges of a JSON string, and values that are not
// one string.
var validJSONCases = []string{
	`""`, `"a"`, ` "a" `, "\t\"a\"\r\n", `"a" "b"`, `"a"x`, `"`, `"a`, `"\"`, `"\\"`, `"\/"`,
	`"\b\f\n\r\t"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00e"`, `"\u00e"x`, `"\x"`, "\"a\x01\"", "\"a\x1f\"",
	"\"\xff\xfe\"", "\"\x7f\"", `"é"`, `"a\`, `"\u`, `"\u0000"`, `["a"]`, `{"a":1}`, `1`, `null`, ``, ` `, `"a",`,
}

// TestValidJSONAgreesWithTheStandardLibrary: the fast path judges every
// string as json.Valid does.
func TestValidJSONAgreesWithTheStandardLibrary(t *testing.T) {
	long, _ := json.Marshal(strings.Repeat("a line of \"text\", with <tags> & a tab\t\n", 1000))
	for _, c := range append(validJSONCases, string(long), string(long[:len(long)-1]), string(long)+"]") {
		if got, want := ValidJSON([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("ValidJSON(%q) = %v, json.Valid says %v", c, got, want)
		}
	}
}

func FuzzValidJSON(f *testing.F) {
	for _, c := range validJSONCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := ValidJSON(b), json.Valid(b); got != want {
			t.Errorf("ValidJSON(%q) = %v, json.Valid says %v", b, got, want)
		}
	})
}

// BenchmarkValidJSON compares the fast path with json.Valid on a 1 MB
// text content:
//
//	go test -run '^$' -bench BenchmarkValidJSON ./providers/
func BenchmarkValidJSON(b *testing.B) {
	content := TextMessage("user", strings.Repeat("The shipment left the warehouse on Monday; the customer asked \"twice\".\n", 1<<20/70)).Content
	for _, bc := range []struct {
		name  string
		valid func([]byte) bool
	}{{"json.Valid", json.Valid}, {"ValidJSON", ValidJSON}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(content)))
			for b.Loop() {
				if !bc.valid(content) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
