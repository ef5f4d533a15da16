package exchange

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/durallm/durallm/providers"
)

func TestARequestOnARecordRouteCarriesStoreAndTheIds(t *testing.T) {
	ids := RecordIDs{AttemptID: "run-1", ActionRef: "act-1"}
	fifteen := map[string]string{}
	for i := range 15 {
		fifteen[fmt.Sprintf("k%d", i)] = "v"
	}
	fourteen := maps.Clone(fifteen)
	delete(fourteen, "k0")
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	for _, tc := range []struct {
		name   string
		params map[string]json.RawMessage
		ids    RecordIDs
		want   map[string]string // the metadata sent; nil: refused
		reason string            // in the refusal
	}{
		{name: "no params", want: map[string]string{MetadataAttemptID: "run-1", MetadataActionID: "act-1"}},
		{name: "the caller's metadata is kept", params: map[string]json.RawMessage{"metadata": raw(map[string]string{"team": "x"}), "temperature": raw(0.2)},
			want: map[string]string{"team": "x", MetadataAttemptID: "run-1", MetadataActionID: "act-1"}},
		{name: "the caller's store true", params: map[string]json.RawMessage{"store": raw(true)}, want: map[string]string{MetadataAttemptID: "run-1", MetadataActionID: "act-1"}},
		{name: "metadata null", params: map[string]json.RawMessage{"metadata": json.RawMessage("null")}, want: map[string]string{MetadataAttemptID: "run-1", MetadataActionID: "act-1"}},
		{name: "the same ids already there", params: map[string]json.RawMessage{"metadata": raw(map[string]string{MetadataAttemptID: "run-1"})},
			want: map[string]string{MetadataAttemptID: "run-1", MetadataActionID: "act-1"}},
		{name: "fourteen of the caller's fit", params: map[string]json.RawMessage{"metadata": raw(fourteen)}, want: func() map[string]string {
			m := maps.Clone(fourteen)
			m[MetadataAttemptID], m[MetadataActionID] = "run-1", "act-1"
			return m
		}()},
		{name: "fifteen overflow", params: map[string]json.RawMessage{"metadata": raw(fifteen)}, reason: "17 pairs"},
		{name: "store false", params: map[string]json.RawMessage{"store": raw(false)}, reason: `params["store"]`},
		{name: "metadata not strings", params: map[string]json.RawMessage{"metadata": raw(map[string]int{"n": 1})}, reason: "not an object of strings"},
		{name: "durallm's key taken", params: map[string]json.RawMessage{"metadata": raw(map[string]string{MetadataActionID: "other"})}, reason: "durallm's own"},
		{name: "a key too long", params: map[string]json.RawMessage{"metadata": raw(map[string]string{strings.Repeat("k", 65): "v"})}, reason: "key is longer than 64"},
		{name: "an action id too long", ids: RecordIDs{AttemptID: "run-1", ActionRef: strings.Repeat("é", 513)}, reason: "longer than 512"},
		{name: "no attempt id", ids: RecordIDs{ActionRef: "act-1"}, reason: "names no attempt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}, Params: tc.params}
			id := ids
			if tc.ids != (RecordIDs{}) {
				id = tc.ids
			}
			out, err := withProviderRecord(in, id)
			if tc.want == nil {
				if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("err %v, want ErrUnsupported naming %q", err, tc.reason)
				}
				if strings.Contains(err.Error(), "other") || strings.Contains(err.Error(), "kkkk") {
					t.Fatalf("the refusal quotes a value or key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]string
			if err := json.Unmarshal(out.Params["metadata"], &got); err != nil || !maps.Equal(got, tc.want) || string(out.Params["store"]) != "true" {
				t.Fatalf("metadata %s (%v), store %s; want %v", out.Params["metadata"], err, out.Params["store"], tc.want)
			}
			for k, v := range tc.params {
				if k != "metadata" && k != "store" && string(out.Params[k]) != string(v) {
					t.Fatalf("param %s changed", k)
				}
			}
			if _, ok := in.Params["store"]; ok != (tc.params["store"] != nil) {
				t.Fatal("the caller's params were modified in place")
			}
		})
	}
}

func TestParseStoredListKeepsOnlyTheAttemptsOwn(t *testing.T) {
	data := []byte(`{"object":"list","has_more":true,"data":[
		{"id":"c1","created":1700000000,"metadata":{"durallm_attempt_id":"a"},"choices":[{"finish_reason":"stop","message":{"content":"first"}}],"usage":{"total_tokens":"7"}},
		{"id":"x","metadata":{"durallm_attempt_id":"b"},"choices":[{"message":{"content":"someone else's"}}]},
		{"id":"y","choices":[{"message":{"content":"no metadata"}}]},
		{"id":"c2","metadata":{"durallm_attempt_id":"a"},"status":"in_progress","choices":[]}
	]}`)
	f, err := parseStoredList(data, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Completions) != 2 || f.Foreign != 2 || !f.More {
		t.Fatalf("%+v", f)
	}
	first, second := f.Completions[0], f.Completions[1]
	if first.Response.ID != "c1" || first.Response.Text != "first" || first.Response.FinishReason != "stop" || first.Response.Usage.TotalTokens != 7 ||
		!first.Usable || first.Created.Unix() != 1700000000 {
		t.Fatalf("first %+v", first)
	}
	if second.Usable || !second.Created.IsZero() {
		t.Fatalf("an in-progress record is usable: %+v", second)
	}
	for _, bad := range []string{``, `{}`, `{"data":{}}`, `[1]`} {
		if _, err := parseStoredList([]byte(bad), "a"); !errors.Is(err, ErrMalformedResponse) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// A stored completion whose status says it is not finished holds at most
// part of the answer: however much text it has, it is unusable (the
// request ran, but it gives nothing to settle the action with).
func TestAStoredCompletionInProgressWithTextIsUnusable(t *testing.T) {
	for _, tc := range []struct {
		status string
		usable bool
	}{
		{"", true}, {`"completed"`, true},
		{`"in_progress"`, false}, {`"queued"`, false}, {`"incomplete"`, false}, {`"failed"`, false}, {`"cancelled"`, false},
		{`"something new"`, false},
	} {
		status := ""
		if tc.status != "" {
			status = `"status":` + tc.status + `,`
		}
		data := []byte(`{"object":"list","data":[{"id":"c1",` + status + `"metadata":{"durallm_attempt_id":"a"},"choices":[{"finish_reason":"stop","message":{"content":"the first half"}}]}]}`)
		f, err := parseStoredList(data, "a")
		if err != nil || len(f.Completions) != 1 {
			t.Fatalf("status %s: %+v %v", tc.status, f, err)
		}
		if got := f.Completions[0].Usable; got != tc.usable {
			t.Errorf("status %s with text: usable %v, want %v", tc.status, got, tc.usable)
		}
	}
}
