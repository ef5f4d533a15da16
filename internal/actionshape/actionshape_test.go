package actionshape

import (
	"strings"
	"testing"
)

// Volatile values are compared by their JSON kind, everything else by
// value; Diff names each path where two shapes differ.
func TestShapesCompareVolatileValuesByKind(t *testing.T) {
	type rec struct {
		ID      string  `json:"id"`
		Elapsed float64 `json:"elapsed"`
		State   string  `json:"state"`
		Ref     string  `json:"result_ref,omitempty"`
	}
	shape := func(v any) any {
		s, err := Of(v)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tt := range []struct {
		name string
		a, b any
		want []string
	}{
		{"ids, times and refs differ: the same", rec{"a", 1, "completed", "file:1"}, rec{"b", 2, "completed", "file:2"}, nil},
		{"a state differs", rec{"a", 1, "completed", ""}, rec{"a", 1, "canceled", ""}, []string{".state: x completed, y canceled"}},
		{"a volatile value present on one side only", rec{"a", 1, "completed", "file:1"}, rec{"a", 1, "completed", ""}, []string{".result_ref: x <string>, y <nil>"}},
		{"in a list", []rec{{State: "completed"}}, []rec{{State: "failed"}}, []string{"[0].state: x completed, y failed"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := Diff("x", shape(tt.a), "y", shape(tt.b))
			if got != strings.Join(tt.want, "\n") {
				t.Fatalf("diff %q, want %q", got, tt.want)
			}
		})
	}
}
