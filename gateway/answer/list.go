package answer

import (
	"net/url"
	"strconv"
)

// ListPage selects one page of a list of n items as OpenAI's list
// endpoints page them (input_items): oldest first when the query says
// order=asc, newest first otherwise (the items are given oldest first);
// after the item whose id (id(i)) it names; limit 1 to 100 items, 20 by
// default. It returns the items' indexes in the page's order and whether
// more follow; a problem is an InvalidRequest naming the query's member.
func ListPage(n int, id func(i int) string, q url.Values) (page []int, more bool, p *Problem) {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	switch q.Get("order") {
	case "", "desc":
		for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
			order[i], order[j] = order[j], order[i]
		}
	case "asc":
	default:
		return nil, false, &Problem{Kind: InvalidRequest, Param: "order", Message: "order must be asc or desc"}
	}
	limit := 20
	if v := q.Get("limit"); v != "" {
		l, err := strconv.Atoi(v)
		if err != nil || l < 1 || l > 100 {
			return nil, false, &Problem{Kind: InvalidRequest, Param: "limit", Message: "limit must be 1 to 100"}
		}
		limit = l
	}
	if after := q.Get("after"); after != "" {
		found := false
		for k, i := range order {
			if id(i) == after {
				order, found = order[k+1:], true
				break
			}
		}
		if !found {
			return nil, false, &Problem{Kind: InvalidRequest, Param: "after", Message: "after names no item of this list"}
		}
	}
	return order[:min(limit, len(order))], len(order) > limit, nil
}
