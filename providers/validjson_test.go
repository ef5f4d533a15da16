package providers

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// validJSONCases are the edges of a JSON string, and values that are not
// one string.
var validJSONCases = []string{
	`""`, `"a"`, ` "a" `, "\t\"a\"\r\n", `"a" "b"`, `"a"x`, `"`, `"a`, `"\"`, `"\\"`, `"\/"`,
	`"\b\f\n\r\t"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00e"`, `"\u00e"x`, `"\x"`, "\"a\x01\"", "\"a\x1f\"",
	"\"\xff\xfe\"", "\"\x7f\"", `"é"`, `"a\`, `"\u`, `"\u0000"`, `["a"]`, `{"a":1}`, `1`, `null`, ``, ` `, `"a",`,
	`[]`, `{}`, ` [ ] `, `[1,]`, `[,1]`, `{"a":}`, `{"a" 1}`, `{a:1}`, `{"a":1,}`, `{"a":1 "b":2}`, `[1 2]`, `[`, `]`, `{`, `}`, `[}`, `{]`,
	`0`, `-0`, `-`, `01`, `1.`, `.1`, `1.5`, `1e`, `1e+`, `1e+5`, `1E-05`, `-1.25e10`, `1.e5`, `+1`, `0x1`, `1 2`,
	`true`, `false`, `nul`, `nulll`, `True`, `tru e`, `[true,false,null]`, `{"a":{"b":[{"c":"d"}]}}`, "[\"a\"\t,\n\"b\"\r]",
	`[{"type":"text","text":"hi \"you\""},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]`,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000), strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
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

// TestAppendJSONDecodesAsJSONMarshalDoes: what AppendJSON writes decodes
// to the request json.Marshal's output decodes to, its verbatim members
// the same JSON (json.Marshal writes them compacted).
func TestAppendJSONDecodesAsJSONMarshalDoes(t *testing.T) {
	for _, r := range []Request{
		{},
		{Messages: []Message{}},
		{Messages: []Message{TextMessage("user", "hi <b> & \"you\"\n")}},
		{
			Messages: []Message{
				TextMessage("system", "be brief"),
				{Role: "user", Content: json.RawMessage(" [ {\"type\": \"text\", \"text\": \"<x>\"} ] "), Name: "ann & bob"},
				{Role: "assistant", ToolCalls: json.RawMessage(`[{"id": "c1"}]`)},
				{Role: "tool", Content: json.RawMessage(`"ok"`), ToolCallID: "c1"},
			},
			Tools:          []json.RawMessage{json.RawMessage(`{"type": "function"}`), json.RawMessage(`{"type":"custom"}`)},
			ToolChoice:     json.RawMessage(`"auto"`),
			ResponseFormat: json.RawMessage(`{"type":"json_schema"}`),
			Stream:         true,
			Params:         map[string]json.RawMessage{"temperature": json.RawMessage(`0.5`), "b<>": json.RawMessage(`{"x": [1, 2]}`), "a": json.RawMessage(`null`)},
		},
	} {
		b, err := r.AppendJSON([]byte("prefix"))
		if err != nil {
			t.Fatal(err)
		}
		if string(b[:6]) != "prefix" || !json.Valid(b[6:]) {
			t.Fatalf("AppendJSON(%+v) = %s", r, b)
		}
		var got, want Request
		if err := json.Unmarshal(b[6:], &got); err != nil {
			t.Fatal(err)
		}
		m, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(m, &want); err != nil {
			t.Fatal(err)
		}
		// json.Marshal compacts verbatim members: compare the two
		// decodings as json.Marshal writes them.
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if string(g) != string(w) {
			t.Errorf("AppendJSON decodes to\n%s\njson.Marshal's to\n%s", g, w)
		}
	}
}

// TestAppendJSONRefusesAMemberThatIsNotJSON, as json.Marshal does.
func TestAppendJSONRefusesAMemberThatIsNotJSON(t *testing.T) {
	for _, r := range []Request{
		{Messages: []Message{{Role: "user", Content: json.RawMessage(`"open`)}}},
		{Messages: []Message{{Role: "assistant", ToolCalls: json.RawMessage(`[`)}}},
		{Tools: []json.RawMessage{json.RawMessage(`{`)}},
		{ToolChoice: json.RawMessage(`auto`)},
		{ResponseFormat: json.RawMessage(`{"type"}`)},
		{Params: map[string]json.RawMessage{"t": json.RawMessage(`0.5.`)}},
	} {
		if _, err := r.AppendJSON(nil); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: err = %v, want ErrInvalidRequest", r, err)
		}
		if _, err := json.Marshal(r); err == nil {
			t.Errorf("%+v: json.Marshal accepts it", r)
		}
	}
}
