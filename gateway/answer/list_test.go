package answer

import (
	"net/url"
	"strconv"
	"testing"
)

func TestListPage(t *testing.T) {
	id := func(i int) string { return "item_" + strconv.Itoa(i) }
	for _, tc := range []struct {
		query string
		want  []int
		more  bool
		param string
	}{
		{"", []int{4, 3, 2, 1, 0}, false, ""},
		{"order=asc", []int{0, 1, 2, 3, 4}, false, ""},
		{"limit=2", []int{4, 3}, true, ""},
		{"limit=2&after=item_3", []int{2, 1}, true, ""},
		{"order=asc&after=item_3", []int{4}, false, ""},
		{"after=item_0", []int{}, false, ""},
		{"after=item_9", nil, false, "after"},
		{"order=up", nil, false, "order"},
		{"limit=0", nil, false, "limit"},
		{"limit=101", nil, false, "limit"},
	} {
		q, _ := url.ParseQuery(tc.query)
		got, more, p := ListPage(5, id, q)
		if tc.param != "" {
			if p == nil || p.Kind != InvalidRequest || p.Param != tc.param {
				t.Errorf("%q: %v, want an invalid %s", tc.query, p, tc.param)
			}
			continue
		}
		if p != nil || more != tc.more || len(got) != len(tc.want) {
			t.Errorf("%q: %v %v %v, want %v %v", tc.query, got, more, p, tc.want, tc.more)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%q: %v, want %v", tc.query, got, tc.want)
				break
			}
		}
	}
}
