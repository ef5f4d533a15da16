package recovery_test

import (
	"encoding/json"
	"strings"
	"testing"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// unassignedCodes are HTTP/2 error codes RFC 9113 does not define. A peer
// may send any 32-bit value in GOAWAY or RST_STREAM, so these stand for
// the 2^32-14 values that must not each become a reason or a stats key.
var unassignedCodes = []evidence.ErrCode{0xe, 0x77, 0xdeadbeef, 0xffffffff}

// Defect 16: peer-chosen error codes became metric label values
// (UNKNOWN_0x…, rst_stream_<code>). Reasons and stats keys feed metric
// attributes, so an unassigned code must land in one bucket; the evidence,
// which is history and not a metric, keeps the exact code.
func TestPeerChosenErrorCodesDoNotBecomeLabelValues(t *testing.T) {
	for _, c := range unassignedCodes {
		t.Run(c.String(), func(t *testing.T) {
			rst := evidence.Evidence{ConnRef: "p-c1", RequestSent: true, StreamID: 1, RSTStream: &c}
			if got := evidence.Classify(rst).Reason; got != "rst_stream_UNKNOWN" {
				t.Errorf("RST_STREAM %s: reason %q, want rst_stream_UNKNOWN", c, got)
			}
			ga := evidence.Evidence{ConnRef: "p-c1", RequestSent: true, StreamID: 5, GoAway: &evidence.GoAway{LastStreamID: 1, Code: c}}
			if got := evidence.Classify(ga).Reason; got != "goaway_UNKNOWN" {
				t.Errorf("GOAWAY %s: reason %q, want goaway_UNKNOWN", c, got)
			}
			b, err := json.Marshal(ga)
			if err != nil {
				t.Fatal(err)
			}
			var back evidence.Evidence
			if err := json.Unmarshal(b, &back); err != nil || back.GoAway == nil || back.GoAway.Code != c {
				t.Errorf("evidence lost the exact code: %s -> %+v (%v)", b, back.GoAway, err)
			}
		})
	}
	// Assigned codes keep their RFC names: a dashboard can still tell
	// PROTOCOL_ERROR from INTERNAL_ERROR.
	internal := evidence.CodeInternalError
	if got := evidence.Classify(evidence.Evidence{RequestSent: true, StreamID: 1, RSTStream: &internal}).Reason; got != "rst_stream_INTERNAL_ERROR" {
		t.Errorf("RST_STREAM INTERNAL_ERROR: reason %q", got)
	}

	t.Run("engine GOAWAY counter", func(t *testing.T) {
		h := newHarness(t)
		h.p.Push(providertest.GoAwayAbove(http2.ErrCode(0xdeadbeef)))
		r := h.send(t.Context(), recovery.Spec{IdempotencyKey: "ga-unknown"}, h.p.URL(), false, nil)
		if r.ev.GoAway == nil || r.ev.GoAway.Code != 0xdeadbeef {
			t.Fatalf("evidence goaway %+v, want the exact code 0xdeadbeef", r.ev.GoAway)
		}
		got := h.e.Stats().GoAways
		if len(got) != 1 || got["UNKNOWN"] != 1 {
			t.Fatalf("GOAWAY counter keys %v, want exactly UNKNOWN:1", got)
		}
		for k := range got {
			if strings.Contains(k, "0x") {
				t.Fatalf("GOAWAY counter key %q holds the peer's code", k)
			}
		}
	})
}
