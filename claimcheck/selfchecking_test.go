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
