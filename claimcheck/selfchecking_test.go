package claimcheck_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

var _ claimcheck.SelfChecking = (*workflows.ActionInput)(nil)

// TestASelfCheckingValueDecodesAsJSONUnmarshalDecodesIt: an ActionInput,
// stored by reference or inline, one payload or among several, decodes
// through the converter to what json.Unmarshal makes of the same JSON,
// durations written as strings included.
func TestASelfCheckingValueDecodesAsJSONUnmarshalDecodesIt(t *testing.T) {
	dc := forWorkflow(claimcheck.DataConverter(dirStore(t), claimcheck.Options{Logger: quiet}), "wf")
	for _, n := range []int{10, 64 << 10} {
		in := workflows.ActionInput{
			Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", strings.Repeat("<x> & y ", n/8))}},
			Routes:  []string{"a", "b"}, Deadline: time.Minute, Caller: "c",
		}
		p, err := dc.ToPayload(in)
		if err != nil {
			t.Fatal(err)
		}
		var got workflows.ActionInput
		if err := dc.FromPayload(p, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, in) {
			t.Errorf("%d bytes: FromPayload = %+v, want %+v", n, got, in)
		}
		ps, err := dc.ToPayloads("first", in)
		if err != nil {
			t.Fatal(err)
		}
		var first string
		var second workflows.ActionInput
		if err := dc.FromPayloads(ps, &first, &second); err != nil || first != "first" || !reflect.DeepEqual(second, in) {
			t.Errorf("%d bytes: FromPayloads = %q, %+v, %v", n, first, second, err)
		}
	}
	strs := &commonpb.Payload{Metadata: map[string][]byte{converter.MetadataEncoding: []byte(converter.MetadataEncodingJSON)},
		Data: []byte(`{"request":{"messages":[{"role":"user","content":"hi"}]},"routes":["a"],"deadline":"2m","queue_timeout":"1s"}`)}
	var got, want workflows.ActionInput
	if err := dc.FromPayload(strs, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(strs.Data, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || got.Deadline != 2*time.Minute {
		t.Errorf("durations as strings: %+v, want %+v", got, want)
	}
}

// TestASelfCheckingValueRefusesAPayloadThatIsNotJSON: the check the
// converter leaves to the value is made.
func TestASelfCheckingValueRefusesAPayloadThatIsNotJSON(t *testing.T) {
	dc := forWorkflow(claimcheck.DataConverter(dirStore(t), claimcheck.Options{Logger: quiet}), "wf")
	for _, data := range []string{`{"routes":["a"]`, `{"routes":["a"]} x`, `{"request":{"messages":[{"role":"user","content":"a` + "\x01" + `"}]}}`} {
		p := &commonpb.Payload{Metadata: map[string][]byte{converter.MetadataEncoding: []byte(converter.MetadataEncodingJSON)}, Data: []byte(data)}
		var in workflows.ActionInput
		if err := dc.FromPayload(p, &in); !errors.Is(err, converter.ErrUnableToDecode) {
			t.Errorf("%q: err = %v, want ErrUnableToDecode", data, err)
		}
		if err := dc.FromPayloads(&commonpb.Payloads{Payloads: []*commonpb.Payload{p}}, &in); !errors.Is(err, converter.ErrUnableToDecode) {
			t.Errorf("%q: FromPayloads err = %v, want ErrUnableToDecode", data, err)
		}
	}
}

var (
	_ claimcheck.SelfEncoding = workflows.ActionInput{}
	_ claimcheck.SelfEncoding = attempt.Input{}
)

// TestASelfEncodingValueDecodesAsItsJSONMarshalDoes: an ActionInput and
// an attempt's Input with every member set, written by the converter
// (their own JSON), decode to what json.Marshal's output decodes to.
func TestASelfEncodingValueDecodesAsItsJSONMarshalDoes(t *testing.T) {
	dc := forWorkflow(claimcheck.DataConverter(dirStore(t), claimcheck.Options{Logger: quiet}), "wf")
	req := providers.Request{
		Messages:   []providers.Message{providers.TextMessage("user", strings.Repeat("<x> & y ", 1<<10)), {Role: "tool", Content: json.RawMessage(`"ok"`), ToolCallID: "c"}},
		Tools:      []json.RawMessage{json.RawMessage(`{"type":"function"}`)},
		ToolChoice: json.RawMessage(`"auto"`), Stream: true, Params: map[string]json.RawMessage{"max_tokens": json.RawMessage(`64`)},
	}
	budget := workflows.Budget{Tokens: 1000}
	values := []any{
		workflows.ActionInput{
			Request: req, Routes: []string{"a", "b"}, Needs: providers.Capabilities{Tools: true}, MaxAttempts: 3,
			Deadline: time.Minute, AttemptTimeout: time.Second, QueueTimeout: 2 * time.Second, ReconcileTimeout: time.Hour,
			ReplayPolicy: workflows.ReplayIdempotent, IdempotencyKey: "k", Backoff: workflows.Backoff{Initial: time.Second, Max: time.Minute},
			RetriesPerRoute: 2, NotifyParent: true, Budget: &budget, Caller: "c",
		},
		workflows.ActionInput{Routes: []string{"a"}},
		attempt.Input{ActionRef: "a", Attempt: 2, AttemptID: "r-2", IdempotencyKey: "k", Route: "r", Request: req, Avoid: []string{"c1"},
			FreshConnection: true, AfterMisdirected: true, Timeout: time.Second, Caller: "c", CapacityWait: time.Minute},
	}
	for _, v := range values {
		p, err := dc.ToPayload(v)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := dc.ToPayloads(v)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []*commonpb.Payload{p, ps.Payloads[0]} {
			got := reflect.New(reflect.TypeOf(v))
			if err := dc.FromPayload(p, got.Interface()); err != nil {
				t.Fatal(err)
			}
			wantV := reflect.New(reflect.TypeOf(v))
			if err := json.Unmarshal(want, wantV.Interface()); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Elem().Interface(), wantV.Elem().Interface()) {
				t.Errorf("%T: the converter's payload decodes to\n%+v\njson.Marshal's to\n%+v", v, got.Elem().Interface(), wantV.Elem().Interface())
			}
		}
	}
	bad := workflows.ActionInput{Request: providers.Request{Messages: []providers.Message{{Role: "user", Content: json.RawMessage(`"open`)}}}, Routes: []string{"a"}}
	if _, err := dc.ToPayload(bad); !errors.Is(err, converter.ErrUnableToEncode) {
		t.Errorf("a request that is not JSON: err = %v, want ErrUnableToEncode", err)
	}
	if _, err := dc.ToPayloads("x", bad); !errors.Is(err, converter.ErrUnableToEncode) {
		t.Errorf("ToPayloads, a request that is not JSON: err = %v, want ErrUnableToEncode", err)
	}
}
