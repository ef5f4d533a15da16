package providers

import "encoding/json"

// ValidJSON reports what json.Valid reports, faster for the value that
// makes a request large: one JSON string (a long text content). A string
// is checked by a loop over its bytes, as encoding/json's scanner would
// check it (no UTF-8 check, as there); anything else goes to json.Valid.
func ValidJSON(b []byte) bool {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '"' {
		return json.Valid(b)
	}
	end, ok := stringEnd(b, i+1)
	return ok && skipSpace(b, end) == len(b)
}

// skipSpace is the index of the first byte from i on that is not JSON
// white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// plainInString marks the bytes that stand for themselves inside a JSON
// string: all but the control characters, the quote and the backslash.
var plainInString = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// stringEnd is the index just after the closing quote of the JSON string
// whose contents begin at b[i], and whether it is a valid string.
func stringEnd(b []byte, i int) (int, bool) {
	for i < len(b) {
		for i < len(b) && plainInString[b[i]] {
			i++
		}
		if i == len(b) {
			break
		}
		switch b[i] {
		case '"':
			return i + 1, true
		case '\\':
			i++
			if i == len(b) {
				return i, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+4 >= len(b) || !isHex(b[i+1]) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) {
					return i, false
				}
				i += 5
			default:
				return i, false
			}
		default: // a control character
			return i, false
		}
	}
	return i, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
