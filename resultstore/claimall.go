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

// PutForAll writes every action's claim, then the data (as PutFor); with
// no actionRefs it is Put.
func (d Dir) PutForAll(ctx context.Context, actionRefs []string, data []byte) (string, error) {
	if len(actionRefs) == 0 {
		return d.Put(ctx, data)
	}
	if err := CheckSize(int64(len(data)), d.Limit()); err != nil {
		return "", err
	}
	ref := Ref(fileScheme, data)
	name := strings.TrimPrefix(ref, fileScheme+":")
	if d.storedBeforeClaims(name) {
		if err := d.hold(name); err != nil {
			return "", err
		}
	}
	for _, a := range actionRefs {
		if err := d.claim(name, claimName(a), a); err != nil {
			return "", err
		}
	}
	return ref, d.write(name, ref, data)
}
