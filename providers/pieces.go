package providers

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Pieces records how a streamed answer reached its subscribers: the
// pieces its text, refusal and tool calls were handed on in, in order,
// each by its kind and size, the content itself staying in the Response.
// From a Response and its Pieces anyone rebuilds the same deltas, so a
// reader that never saw the stream (another gateway, one restarted since)
// numbers it as the one that relayed it did, and a reader resuming after
// the Nth piece gets exactly the rest.
//
// The text is a space-separated list: "t<bytes>" a piece of text,
// "r<bytes>" a piece of refusal, "c<call>:<marks>:<bytes>" a piece of the
// arguments of tool call <call> (its position, from 0), whose marks say
// which of the call's id ("i"), type ("y") and name ("n") it carried.
// Empty when nothing streamed.
type Pieces string

// PieceKind says what a Piece is a piece of.
type PieceKind byte

// The kinds of piece.
const (
	PieceText     PieceKind = 't'
	PieceRefusal  PieceKind = 'r'
	PieceToolCall PieceKind = 'c'
)

// Piece is one piece of a streamed answer.
type Piece struct {
	Kind PieceKind
	// Len is the piece's size in bytes: of text, of refusal, or of the
	// tool call's arguments.
	Len int
	// Call is a tool-call piece's call, its position from 0.
	Call int
	// ID, Type and Name say a tool-call piece carried the call's id,
	// type and name.
	ID, Type, Name bool
}

// ErrBadPieces is returned by Pieces.Parse for a text that is not a list
// of pieces.
var ErrBadPieces = errors.New("providers: malformed pieces")

// Append is p with x added at its end.
func (p Pieces) Append(x Piece) Pieces {
	var b strings.Builder
	b.WriteString(string(p))
	if p != "" {
		b.WriteByte(' ')
	}
	b.WriteByte(byte(x.Kind))
	if x.Kind == PieceToolCall {
		b.WriteString(strconv.Itoa(x.Call))
		b.WriteByte(':')
		for _, m := range []struct {
			on   bool
			mark byte
		}{{x.ID, 'i'}, {x.Type, 'y'}, {x.Name, 'n'}} {
			if m.on {
				b.WriteByte(m.mark)
			}
		}
		b.WriteByte(':')
	}
	b.WriteString(strconv.Itoa(x.Len))
	return Pieces(b.String())
}

// Parse reads the pieces in order.
func (p Pieces) Parse() ([]Piece, error) {
	fields := strings.Fields(string(p))
	out := make([]Piece, 0, len(fields))
	for i, f := range fields {
		x, err := parsePiece(f)
		if err != nil {
			return nil, fmt.Errorf("%w: piece %d", ErrBadPieces, i)
		}
		out = append(out, x)
	}
	return out, nil
}

func parsePiece(f string) (Piece, error) {
	x := Piece{Kind: PieceKind(f[0])}
	rest := f[1:]
	switch x.Kind {
	case PieceText, PieceRefusal:
	case PieceToolCall:
		call, marks, ok := strings.Cut(rest, ":")
		if !ok {
			return x, ErrBadPieces
		}
		marks, rest, ok = strings.Cut(marks, ":")
		if !ok {
			return x, ErrBadPieces
		}
		n, err := strconv.Atoi(call)
		if err != nil || n < 0 {
			return x, ErrBadPieces
		}
		x.Call = n
		for _, m := range marks {
			switch m {
			case 'i':
				x.ID = true
			case 'y':
				x.Type = true
			case 'n':
				x.Name = true
			default:
				return x, ErrBadPieces
			}
		}
	default:
		return x, ErrBadPieces
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 {
		return x, ErrBadPieces
	}
	x.Len = n
	return x, nil
}
