package providers

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
)

// ValidJSON reports what json.Valid reports, several times as fast on
// the values that make a request large (a long text content, content
// parts holding one): it checks the JSON grammar as encoding/json's
// scanner does, down to its nesting limit and without a UTF-8 check, with
// a plain loop over a string's bytes where the scanner takes a step per
// byte.
func ValidJSON(b []byte) bool {
	end, ok := valueEnd(b, skipSpace(b, 0), 0)
	return ok && skipSpace(b, end) == len(b)
}

// maxNesting is encoding/json's limit on nested arrays and objects.
const maxNesting = 10000

// valueEnd is the index just after the JSON value that begins at b[i],
// nested depth arrays and objects deep, and whether it is valid.
func valueEnd(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return stringEnd(b, i+1)
	case c == '{' || c == '[':
		if depth == maxNesting {
			return i, false
		}
		return containerEnd(b, i, depth+1)
	case c == '-' || '0' <= c && c <= '9':
		return numberEnd(b, i)
	case c == 't':
		return literalEnd(b, i, "true")
	case c == 'f':
		return literalEnd(b, i, "false")
	case c == 'n':
		return literalEnd(b, i, "null")
	}
	return i, false
}

// containerEnd is valueEnd for the object or array that opens at b[i].
func containerEnd(b []byte, i, depth int) (int, bool) {
	object, closing := b[i] == '{', byte(']')
	if object {
		closing = '}'
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == closing {
		return i + 1, true
	}
	for {
		var ok bool
		if object {
			if i >= len(b) || b[i] != '"' {
				return i, false
			}
			if i, ok = stringEnd(b, i+1); !ok {
				return i, false
			}
			if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
				return i, false
			}
			i = skipSpace(b, i+1)
		}
		if i, ok = valueEnd(b, i, depth); !ok {
			return i, false
		}
		if i = skipSpace(b, i); i >= len(b) {
			return i, false
		}
		switch b[i] {
		case closing:
			return i + 1, true
		case ',':
			i = skipSpace(b, i+1)
		default:
			return i, false
		}
	}
}

// numberEnd is valueEnd for the number that begins at b[i]:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func numberEnd(b []byte, i int) (int, bool) {
	digits := func() bool {
		start := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i > start
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return i, false
		}
	}
	return i, true
}

// literalEnd is valueEnd for the literal lit expected at b[i].
func literalEnd(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
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

// AppendJSON appends r's JSON to b: what json.Marshal writes for r, with
// every verbatim member (content, tool_calls, tools, tool_choice,
// response_format, params) copied as it is rather than compacted and
// HTML-escaped, so a long content costs a check (ValidJSON) and a copy,
// not a pass of encoding/json's scanner. It decodes to the same Request.
// A verbatim member that is not JSON is an error wrapping
// ErrInvalidRequest, as it is an error for json.Marshal.
func (r Request) AppendJSON(b []byte) ([]byte, error) {
	var err error
	raw := func(field string, v json.RawMessage) {
		switch {
		case err != nil:
		case len(v) == 0:
			b = append(b, "null"...)
		case !ValidJSON(v):
			err = fmt.Errorf("%w: %s: invalid JSON", ErrInvalidRequest, field)
		default:
			b = append(b, v...)
		}
	}
	str := func(s string) {
		q, _ := json.Marshal(s) // a string always encodes
		b = append(b, q...)
	}
	// One allocation for the whole of it, however large the contents.
	b = slices.Grow(b, r.jsonSize())
	b = append(b, `{"messages":`...)
	if r.Messages == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, m := range r.Messages {
			if i > 0 {
				b = append(b, ',')
			}
			field := "messages[" + strconv.Itoa(i) + "]"
			b = append(b, `{"role":`...)
			str(m.Role)
			if len(m.Content) > 0 {
				b = append(b, `,"content":`...)
				raw(field+".content", m.Content)
			}
			if m.Name != "" {
				b = append(b, `,"name":`...)
				str(m.Name)
			}
			if len(m.ToolCalls) > 0 {
				b = append(b, `,"tool_calls":`...)
				raw(field+".tool_calls", m.ToolCalls)
			}
			if m.ToolCallID != "" {
				b = append(b, `,"tool_call_id":`...)
				str(m.ToolCallID)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(r.Tools) > 0 {
		b = append(b, `,"tools":[`...)
		for i, t := range r.Tools {
			if i > 0 {
				b = append(b, ',')
			}
			raw("tools["+strconv.Itoa(i)+"]", t)
		}
		b = append(b, ']')
	}
	if len(r.ToolChoice) > 0 {
		b = append(b, `,"tool_choice":`...)
		raw("tool_choice", r.ToolChoice)
	}
	if len(r.ResponseFormat) > 0 {
		b = append(b, `,"response_format":`...)
		raw("response_format", r.ResponseFormat)
	}
	if r.Stream {
		b = append(b, `,"stream":true`...)
	}
	if len(r.Params) > 0 {
		keys := make([]string, 0, len(r.Params))
		for k := range r.Params {
			keys = append(keys, k)
		}
		sort.Strings(keys) // as json.Marshal orders a map
		b = append(b, `,"params":{`...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			str(k)
			b = append(b, ':')
			raw("params["+strconv.Quote(k)+"]", r.Params[k])
		}
		b = append(b, '}')
	}
	if err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// jsonSize is about the size of r's JSON: its members' sizes and a
// little for their names and quotes (strings that need escapes grow a
// little more).
func (r Request) jsonSize() int {
	n := 128 + len(r.ToolChoice) + len(r.ResponseFormat)
	for _, m := range r.Messages {
		n += 64 + len(m.Role) + len(m.Content) + len(m.Name) + len(m.ToolCalls) + len(m.ToolCallID)
	}
	for _, t := range r.Tools {
		n += 1 + len(t)
	}
	for k, v := range r.Params {
		n += 4 + len(k) + len(v)
	}
	return n
}

// WithRequestMember is the JSON object obj (as json.Marshal writes an
// object: "{}" or "{" members "}") with a "request" member first, r as
// AppendJSON writes it: the JSON of a value that holds a Request, its
// other members encoded by json.Marshal.
func WithRequestMember(obj []byte, r Request) ([]byte, error) {
	if len(obj) < 2 || obj[0] != '{' {
		return nil, fmt.Errorf("providers: %q is not a JSON object", obj)
	}
	b, err := r.AppendJSON(append(make([]byte, 0, len(obj)+r.jsonSize()+16), `{"request":`...))
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if string(obj) == "{}" {
		return append(b, '}'), nil
	}
	return append(append(b, ','), obj[1:]...), nil
}
