package providers

import (
	"errors"
	"reflect"
	"testing"
)

// Pieces written one by one read back the same, in order.
func TestPiecesRoundTrip(t *testing.T) {
	in := []Piece{
		{Kind: PieceText, Len: 3},
		{Kind: PieceRefusal, Len: 0},
		{Kind: PieceToolCall, Call: 0, ID: true, Type: true, Name: true, Len: 0},
		{Kind: PieceToolCall, Call: 1, Name: true, Len: 12},
		{Kind: PieceToolCall, Call: 0, Len: 7},
		{Kind: PieceText, Len: 1024},
	}
	var p Pieces
	for _, x := range in {
		p = p.Append(x)
	}
	if p != "t3 r0 c0:iyn:0 c1:n:12 c0::7 t1024" {
		t.Fatalf("written %q", p)
	}
	got, err := p.Parse()
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("read %+v %v", got, err)
	}
	if got, err := Pieces("").Parse(); err != nil || len(got) != 0 {
		t.Fatalf("empty: %+v %v", got, err)
	}
}

func TestPiecesRefusals(t *testing.T) {
	for _, bad := range []string{"x3", "t", "t-1", "tx", "c0:3", "c:i:3", "c0:q:3", "c-1::3", "t3 c0::"} {
		if _, err := Pieces(bad).Parse(); !errors.Is(err, ErrBadPieces) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
