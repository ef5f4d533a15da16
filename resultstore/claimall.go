package resultstore

import (
	"context"
	"strings"
)

// ClaimsAll is an Expirable store that stores data once for several
// actions at a time (Dir and pgstore.Store are): a payload one workflow
// writes for another, such as a child's input, is kept while either runs.
type ClaimsAll interface {
	Expirable
	// PutForAll is PutFor for each of actionRefs, the data stored once;
	// with no actionRefs it is Put.
	PutForAll(ctx context.Context, actionRefs []string, data []byte) (ref string, err error)
}

// PutForAll writes every action's claim, then the data (as PutFor).
func (d Dir) PutForAll(ctx context.Context, actionRefs []string, data []byte) (string, error) {
	if err := CheckSize(int64(len(data)), d.Limit()); err != nil {
		return "", err
	}
	name := strings.TrimPrefix(Ref(fileScheme, data), fileScheme+":")
	for _, a := range actionRefs {
		if err := d.claim(name, a); err != nil {
			return "", err
		}
	}
	return d.Put(ctx, data)
}
