package recovery

import (
	"bytes"
	"errors"
	"fmt"

	"golang.org/x/net/http2/hpack"
)

// attemptDecoder reads the client's outgoing HPACK header blocks (RFC 7541)
// for one purpose: the value of one header (HeaderAttemptID) in each
// block. It follows the encoder's dynamic table exactly, as it must to
// resolve indexed fields, but keeps only each entry's size, and a value
// only for entries of the wanted header: no maps, and no string for any
// other field. x/net's hpack.Decoder, which it replaces in the observer,
// keeps the whole table in two maps that every insertion and eviction
// updates; with a unique attempt id per request that is one insertion and
// one eviction per request.
//
// It accepts and rejects exactly what x/net's decoder (as the observer
// used it: emitting every field, no string length limit) accepts and
// rejects, so the observer loses a connection on the same blocks; a
// differential fuzz test (FuzzAttemptDecoder) holds it to that.
type attemptDecoder struct {
	name    []byte // the wanted header name, lower case
	maxSize uint32 // the table's current maximum size
	allowed uint32 // the most a size update may set
	size    uint32 // sum of the entries' sizes

	// ents is the dynamic table, oldest first from ents[first]; the
	// newest entry has HPACK index 62.
	ents  []tableEntry
	first int

	huff bytes.Buffer // scratch for Huffman-decoded strings
}

type tableEntry struct {
	size    uint32 // len(name) + len(value) + 32
	nameLen uint32 // len(name), for a literal that reuses the name
	match   bool   // the entry's name is the wanted header
	value   string // its value, kept only when match
}

// staticTableSize is the number of entries in HPACK's static table.
const staticTableSize = 61

// staticNameLens are the lengths of the static table's names (RFC 7541 appendix A). Only
// their lengths matter: a literal with an indexed static name adds an
// entry of len(name)+len(value)+32 bytes. None is the attempt header.
var staticNameLens = func() [staticTableSize + 1]uint32 {
	names := [...]string{"", ":authority", ":method", ":method", ":path", ":path", ":scheme", ":scheme",
		":status", ":status", ":status", ":status", ":status", ":status", ":status",
		"accept-charset", "accept-encoding", "accept-language", "accept-ranges", "accept",
		"access-control-allow-origin", "age", "allow", "authorization", "cache-control",
		"content-disposition", "content-encoding", "content-language", "content-length",
		"content-location", "content-range", "content-type", "cookie", "date", "etag", "expect",
		"expires", "from", "host", "if-match", "if-modified-since", "if-none-match", "if-range",
		"if-unmodified-since", "last-modified", "link", "location", "max-forwards",
		"proxy-authenticate", "proxy-authorization", "range", "referer", "refresh", "retry-after",
		"server", "set-cookie", "strict-transport-security", "transfer-encoding", "user-agent",
		"vary", "via", "www-authenticate"}
	var l [staticTableSize + 1]uint32
	for i, n := range names {
		l[i] = uint32(len(n))
	}
	return l
}()

func newAttemptDecoder(name string, maxSize, allowed uint32) *attemptDecoder {
	return &attemptDecoder{name: []byte(name), maxSize: maxSize, allowed: allowed}
}

var (
	errHpackTruncated = errors.New("hpack: truncated header block")
	errHpackVarint    = errors.New("hpack: varint integer overflow")
	errHpackEncoding  = errors.New("hpack: invalid encoding")
	errHpackSizeLate  = errors.New("hpack: dynamic table size update MUST occur at the beginning of a header block")
	errHpackSizeLarge = errors.New("hpack: dynamic table size update too large")
)

// decode reads one complete header block and returns the last value of
// the wanted header in it, "" if none. After an error the decoder's table
// no longer matches the encoder's; the observer then gives the connection
// up.
func (d *attemptDecoder) decode(block []byte) (string, error) {
	found := ""
	for first := true; len(block) > 0; first = false {
		b := block[0]
		var err error
		switch {
		case b&0x80 != 0: // 6.1 indexed field
			var idx uint64
			if idx, block, err = readVarInt(7, block); err != nil {
				return "", err
			}
			e, ok, err := d.at(idx)
			if err != nil {
				return "", err
			}
			if ok && e.match {
				found = e.value
			}
		case b&0xc0 == 0x40: // 6.2.1 literal with incremental indexing
			if block, err = d.literal(6, true, block, &found); err != nil {
				return "", err
			}
		case b&0xf0 == 0x00, b&0xf0 == 0x10: // 6.2.2 without indexing, 6.2.3 never indexed
			if block, err = d.literal(4, false, block, &found); err != nil {
				return "", err
			}
		case b&0xe0 == 0x20: // 6.3 dynamic table size update
			// x/net's rule, kept so both decoders agree: late only matters
			// while the table holds something.
			if !first && d.size > 0 {
				return "", errHpackSizeLate
			}
			var n uint64
			if n, block, err = readVarInt(5, block); err != nil {
				return "", err
			}
			if n > uint64(d.allowed) {
				return "", errHpackSizeLarge
			}
			d.maxSize = uint32(n)
			d.evict()
		default:
			return "", errHpackEncoding
		}
	}
	return found, nil
}

// at resolves an index: the static table (whose entries never match and
// have only a name length here), then the dynamic table, newest first. ok
// is false for a static entry.
func (d *attemptDecoder) at(idx uint64) (tableEntry, bool, error) {
	if idx == 0 {
		return tableEntry{}, false, fmt.Errorf("hpack: invalid index %d", idx)
	}
	if idx <= staticTableSize {
		return tableEntry{nameLen: staticNameLens[idx]}, false, nil
	}
	n := uint64(len(d.ents) - d.first)
	if idx-staticTableSize > n {
		return tableEntry{}, false, fmt.Errorf("hpack: invalid index %d", idx)
	}
	return d.ents[uint64(len(d.ents))-(idx-staticTableSize)], true, nil
}

// literal reads a literal field with an n-bit name index prefix, adding it
// to the table when indexed.
func (d *attemptDecoder) literal(n uint8, indexed bool, p []byte, found *string) ([]byte, error) {
	nameIdx, p, err := readVarInt(n, p)
	if err != nil {
		return nil, err
	}
	var nameLen uint32
	var match bool
	var rawName, rawValue []byte
	var nameHuff, valueHuff bool
	if nameIdx > 0 {
		e, _, err := d.at(nameIdx)
		if err != nil {
			return nil, err
		}
		nameLen, match = e.nameLen, e.match
	} else if rawName, nameHuff, p, err = readString(p); err != nil {
		return nil, err
	}
	if rawValue, valueHuff, p, err = readString(p); err != nil {
		return nil, err
	}
	// Decoded in the same order as x/net (name, then value), so the same
	// blocks fail.
	if nameIdx == 0 {
		name, err := d.decoded(rawName, nameHuff)
		if err != nil {
			return nil, err
		}
		nameLen, match = uint32(len(name)), bytes.Equal(name, d.name)
	}
	value, err := d.decoded(rawValue, valueHuff)
	if err != nil {
		return nil, err
	}
	var v string
	if match {
		v = string(value)
		*found = v
	}
	if indexed {
		d.add(tableEntry{size: nameLen + uint32(len(value)) + 32, nameLen: nameLen, match: match, value: v})
	}
	return p, nil
}

// decoded returns a string's bytes, Huffman-decoded into scratch space
// when h is set. The result is valid until the next call.
func (d *attemptDecoder) decoded(raw []byte, h bool) ([]byte, error) {
	if !h {
		return raw, nil
	}
	d.huff.Reset()
	if _, err := hpack.HuffmanDecode(&d.huff, raw); err != nil {
		return nil, err
	}
	return d.huff.Bytes(), nil
}

// add inserts e as the newest entry and evicts down to the maximum size;
// an entry larger than the maximum empties the table and is not kept
// (RFC 7541 section 4.4).
func (d *attemptDecoder) add(e tableEntry) {
	d.ents = append(d.ents, e)
	d.size += e.size
	d.evict()
}

func (d *attemptDecoder) evict() {
	for d.size > d.maxSize && d.first < len(d.ents) {
		d.size -= d.ents[d.first].size
		d.ents[d.first] = tableEntry{}
		d.first++
	}
	if d.first == len(d.ents) {
		d.ents, d.first = d.ents[:0], 0
	} else if d.first > 64 && d.first > len(d.ents)/2 {
		// Compact now and then, so the slice does not grow without bound.
		n := copy(d.ents, d.ents[d.first:])
		clear(d.ents[n:])
		d.ents, d.first = d.ents[:n], 0
	}
}

// readVarInt reads an HPACK integer with an n-bit prefix (RFC 7541
// section 5.1), with x/net's overflow rule.
func readVarInt(n uint8, p []byte) (uint64, []byte, error) {
	if len(p) == 0 {
		return 0, nil, errHpackTruncated
	}
	mask := uint64(1)<<n - 1
	i := uint64(p[0]) & mask
	if i < mask {
		return i, p[1:], nil
	}
	p = p[1:]
	var m uint64
	for len(p) > 0 {
		b := p[0]
		p = p[1:]
		i += uint64(b&127) << m
		if b&128 == 0 {
			return i, p, nil
		}
		m += 7
		if m >= 63 {
			return 0, nil, errHpackVarint
		}
	}
	return 0, nil, errHpackTruncated
}

// readString reads a string literal's raw bytes and Huffman flag.
func readString(p []byte) (raw []byte, huff bool, rest []byte, err error) {
	if len(p) == 0 {
		return nil, false, nil, errHpackTruncated
	}
	huff = p[0]&0x80 != 0
	n, p, err := readVarInt(7, p)
	if err != nil {
		return nil, false, nil, err
	}
	if uint64(len(p)) < n {
		return nil, false, nil, errHpackTruncated
	}
	return p[:n], huff, p[n:], nil
}
