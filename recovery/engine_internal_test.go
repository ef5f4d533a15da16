package recovery

import "testing"

// Connection refs are "<engine tag>-c<n>": the tag is all that keeps two
// engines' refs apart, across processes of a fleet too. Two thousand
// engines is a small fleet's worth of workers; with a 16-bit tag a
// collision among them is all but certain (birthday bound: 1-e^(-2000²/2¹⁷)).
func TestConnRefTagsCollideAcrossProcesses(t *testing.T) {
	const n = 2000
	seen := make(map[string]int, n)
	for i := range n {
		tag := New(Config{}).proc
		if j, dup := seen[tag]; dup {
			t.Fatalf("engines %d and %d drew the same connection-ref tag %q", j, i, tag)
		}
		seen[tag] = i
	}
}
