package evidence

import (
	"testing"
)

// A request that may have left (its context ended while x/net was
// writing it, and the write barrier could not prove otherwise) is never
// unsent; a canceled scope still wins.
func TestClassifyMaybeSent(t *testing.T) {
	tests := []struct {
		name   string
		ev     Evidence
		class  Class
		reason string
	}{
		{"timed out while sending", Evidence{ConnRef: "p-c1", MaybeSent: true, TimedOut: true}, Ambiguous, "context_ended_while_sending"},
		{"no stream, so a GOAWAY proves nothing", Evidence{ConnRef: "p-c1", MaybeSent: true, TimedOut: true, GoAway: &GoAway{LastStreamID: 1}}, Ambiguous, "context_ended_while_sending"},
		{"canceled while sending", Evidence{ConnRef: "p-c1", MaybeSent: true, Canceled: true}, Canceled, "scope_canceled"},
		{"without it, the same evidence is unsent", Evidence{ConnRef: "p-c1", TimedOut: true}, Unsent, "timeout_before_send"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Classify(tt.ev)
			if c.Class != tt.class || c.Reason != tt.reason {
				t.Fatalf("%s (%s), want %s (%s)", c.Class, c.Reason, tt.class, tt.reason)
			}
			if c.Class == Ambiguous && c.Class.ReplaySafe() {
				t.Fatalf("ambiguous must never be replay-safe: %+v", c)
			}
		})
	}
}
