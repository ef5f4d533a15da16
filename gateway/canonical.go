package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"unicode/utf8"
)

// canonicalJSON writes a JSON value in canonical form: object keys sorted
// (the last of a repeated key kept), no insignificant whitespace, numbers
// as written, strings as encoding/json writes them (no HTML escaping).
// Text that is not valid Unicode is kept apart rather than decoded to
// U+FFFD: a lone surrogate escape is written as its escape, a byte that
// is not UTF-8 as itself, so two bodies that differ there stay different.
// For valid text the form is what encoding/json gives. data must be valid
// JSON (json.Valid).
type canonicalJSON struct {
	data []byte
	i    int
}

var errNotJSON = errors.New("not JSON")

func (c *canonicalJSON) space() {
	for c.i < len(c.data) {
		switch c.data[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// value appends the canonical form of the value at c.i to out; drop names
// the keys of an object value to leave out.
func (c *canonicalJSON) value(out []byte, drop ...string) ([]byte, error) {
	c.space()
	if c.i >= len(c.data) {
		return nil, errNotJSON
	}
	switch b := c.data[c.i]; {
	case b == '{':
		return c.object(out, drop)
	case b == '[':
		c.i++
		out = append(out, '[')
		for n := 0; ; n++ {
			c.space()
			if c.data[c.i] == ']' {
				c.i++
				return append(out, ']'), nil
			}
			if n > 0 {
				c.i++ // ','
				out = append(out, ',')
			}
			var err error
			if out, err = c.value(out); err != nil {
				return nil, err
			}
		}
	case b == '"':
		s, err := c.str()
		if err != nil {
			return nil, err
		}
		return appendText(out, s), nil
	default:
		// A number as written, true, false or null.
		start := c.i
		for c.i < len(c.data) && !bytes.ContainsRune([]byte(",]} \t\n\r"), rune(c.data[c.i])) {
			c.i++
		}
		return append(out, c.data[start:c.i]...), nil
	}
}

func (c *canonicalJSON) object(out []byte, drop []string) ([]byte, error) {
	type member struct {
		key   string
		value []byte
	}
	var members []member
	c.i++ // '{'
	for n := 0; ; n++ {
		c.space()
		if c.data[c.i] == '}' {
			c.i++
			break
		}
		if n > 0 {
			c.i++ // ','
			c.space()
		}
		key, err := c.str()
		if err != nil {
			return nil, err
		}
		c.space()
		c.i++ // ':'
		v, err := c.value(nil)
		if err != nil {
			return nil, err
		}
		if slices.Contains(drop, key) {
			continue
		}
		if at := slices.IndexFunc(members, func(m member) bool { return m.key == key }); at >= 0 {
			members = slices.Delete(members, at, at+1)
		}
		members = append(members, member{key, v})
	}
	slices.SortFunc(members, func(a, b member) int { return bytesCompare(a.key, b.key) })
	out = append(out, '{')
	for n, m := range members {
		if n > 0 {
			out = append(out, ',')
		}
		out = appendText(out, m.key)
		out = append(out, ':')
		out = append(out, m.value...)
	}
	return append(out, '}'), nil
}

func bytesCompare(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) }

// The markers of text that is not valid Unicode in a decoded string. No
// valid UTF-8 holds either byte, so each marks what follows it.
const (
	// markByte is followed by a byte that is not UTF-8.
	markByte = 0xff
	// markSurrogate is followed by the two bytes of a lone surrogate.
	markSurrogate = 0xfe
)

// str decodes the string at c.i: valid text as UTF-8, the rest marked.
func (c *canonicalJSON) str() (string, error) {
	c.i++ // '"'
	var s []byte
	for {
		if c.i >= len(c.data) {
			return "", errNotJSON
		}
		b := c.data[c.i]
		switch {
		case b == '"':
			c.i++
			return string(s), nil
		case b == '\\':
			var err error
			if s, err = c.escape(s); err != nil {
				return "", err
			}
		default:
			r, size := utf8.DecodeRune(c.data[c.i:])
			if r == utf8.RuneError && size == 1 {
				s = append(s, markByte, b)
			} else {
				s = append(s, c.data[c.i:c.i+size]...)
			}
			c.i += size
		}
	}
}

// escape decodes the escape at c.i onto s.
func (c *canonicalJSON) escape(s []byte) ([]byte, error) {
	c.i++ // '\\'
	e := c.data[c.i]
	c.i++
	switch e {
	case '"', '\\', '/':
		return append(s, e), nil
	case 'b':
		return append(s, '\b'), nil
	case 'f':
		return append(s, '\f'), nil
	case 'n':
		return append(s, '\n'), nil
	case 'r':
		return append(s, '\r'), nil
	case 't':
		return append(s, '\t'), nil
	case 'u':
		r, ok := c.hex4()
		if !ok {
			return nil, errNotJSON
		}
		if r >= 0xd800 && r < 0xdc00 && c.i+6 <= len(c.data) && c.data[c.i] == '\\' && c.data[c.i+1] == 'u' {
			save := c.i
			c.i += 2
			if lo, ok := c.hex4(); ok && lo >= 0xdc00 && lo < 0xe000 {
				return utf8.AppendRune(s, 0x10000+(r-0xd800)<<10+(lo-0xdc00)), nil
			}
			c.i = save
		}
		if r >= 0xd800 && r < 0xe000 {
			return append(s, markSurrogate, byte(r>>8), byte(r)), nil
		}
		return utf8.AppendRune(s, r), nil
	}
	return nil, errNotJSON
}

func (c *canonicalJSON) hex4() (rune, bool) {
	if c.i+4 > len(c.data) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(c.data[c.i:c.i+4]), 16, 16)
	if err != nil {
		return 0, false
	}
	c.i += 4
	return rune(n), true
}

// appendText writes a decoded string as encoding/json writes valid text
// (without HTML escaping), and its marked parts as they came: a lone
// surrogate as its escape, a byte that is not UTF-8 as itself.
func appendText(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); {
		b := s[i]
		switch {
		case b == markByte:
			out = append(out, s[i+1])
			i += 2
			continue
		case b == markSurrogate:
			out = append(out, '\\', 'u', hex[s[i+1]>>4], hex[s[i+1]&0xf], hex[s[i+2]>>4], hex[s[i+2]&0xf])
			i += 3
			continue
		case b < utf8.RuneSelf:
			switch {
			case b == '"' || b == '\\':
				out = append(out, '\\', b)
			case b == '\n':
				out = append(out, '\\', 'n')
			case b == '\r':
				out = append(out, '\\', 'r')
			case b == '\t':
				out = append(out, '\\', 't')
			case b == '\b':
				out = append(out, '\\', 'b')
			case b == '\f':
				out = append(out, '\\', 'f')
			case b < 0x20:
				out = append(out, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			default:
				out = append(out, b)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == '\u2028' || r == '\u2029' {
			out = append(out, '\\', 'u', '2', '0', '2', hex[r&0xf])
		} else {
			out = append(out, s[i:i+size]...)
		}
		i += size
	}
	return append(out, '"')
}

// canonicalBody is the request body in canonical JSON (canonicalJSON),
// without the members that only say how to deliver the answer (stream,
// stream_options): a retry that asks for the same answer streamed or not
// is the same request. The body must be a JSON object.
func canonicalBody(body []byte) ([]byte, error) {
	if !json.Valid(body) {
		return nil, errors.New("the body is not JSON")
	}
	c := &canonicalJSON{data: body}
	c.space()
	if c.i >= len(body) || body[c.i] != '{' {
		return nil, errors.New("the body is not a JSON object")
	}
	return c.value(nil, "stream", "stream_options")
}
