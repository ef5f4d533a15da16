package providertest

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// parseBodyCases are bodies of every shape a client under test may send.
var parseBodyCases = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
	` { "messages" : [ {"role":"user","content":"a \"quoted\" } ] text"} ] , "model" : "m\u0031" , "store" : true , "metadata" : {"k":"v","n":{"x":[1]}} } `,
	`{"MODEL":"upper","Stream":true,"model":"last"}`,
	`{"model":5,"stream":true,"store":true}`,
	`{"model":"m","store":"yes","metadata":{"k":"v"}}`,
	`{"model":"m","store":true,"metadata":[1]}`,
	`{"mod\u0065l":"escaped","st\u0072eam":true}`,
	`{"model":"m","stream":null,"store":false,"metadata":null}`,
	`{"model":"m","n":-1.5e3,"b":false,"x":null,"store":true}`,
	`{}`, `[]`, `[{"model":"m"}]`, `"model"`, `null`, ``, `{"model":"m"`, `{"model":"m",}`, `not json`,
	`{"model":"m"} {"model":"n"}`,
	`{"messages":[` + strings.Repeat(`{"role":"user","content":"text, with \\"quotes\\" and [brackets] {braces}"},`, 100) + `{"role":"user","content":"x"}],"model":"big","stream":true}`,
}

// TestParseBodyReadsWhatDecodingTheWholeBodyReads: reading only the
// members that may name model, stream, store and metadata fills what a
// decoding of the whole body fills.
func TestParseBodyReadsWhatDecodingTheWholeBodyReads(t *testing.T) {
	for _, c := range parseBodyCases {
		checkParseBody(t, []byte(c))
	}
}

func FuzzParseBody(f *testing.F) {
	for _, c := range parseBodyCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkParseBody(t, b) })
}

func checkParseBody(t *testing.T, body []byte) {
	t.Helper()
	got := Request{Body: bytes.Clone(body)}
	parseBody(&got)
	var whole struct {
		Model    string          `json:"model"`
		Stream   bool            `json:"stream"`
		Store    bool            `json:"store"`
		Metadata json.RawMessage `json:"metadata"`
	}
	wholeErr := json.Unmarshal(body, &whole)
	var kept struct {
		Store    bool            `json:"store"`
		Metadata json.RawMessage `json:"metadata"`
	}
	keptErr := json.Unmarshal(body, &kept)
	want := Request{Model: whole.Model, Stream: whole.Stream, store: whole.Store, metadata: whole.Metadata}
	if wholeErr != nil {
		want.store, want.metadata = kept.Store && keptErr == nil, kept.Metadata
	}
	if got.Model != want.Model || got.Stream != want.Stream || got.store != want.store || !bytes.Equal(got.metadata, want.metadata) {
		t.Errorf("parseBody(%q) = %q %v %v %s, want %q %v %v %s", body, got.Model, got.Stream, got.store, got.metadata, want.Model, want.Stream, want.store, want.metadata)
	}
}
