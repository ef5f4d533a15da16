package cluster

import "testing"

// A fault rate outside 0 to 1 is refused before a cluster is started for
// it.
func TestChaosOptionsRejectAFaultRateOutsideZeroToOne(t *testing.T) {
	for _, tt := range []struct {
		faults float64
		ok     bool
	}{{0, true}, {0.2, true}, {1, true}, {-0.1, false}, {1.5, false}} {
		if err := (ChaosOptions{Faults: tt.faults}).Validate(); (err == nil) != tt.ok {
			t.Errorf("Faults %g: Validate() = %v", tt.faults, err)
		}
	}
}
