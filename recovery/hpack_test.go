package recovery

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"

	"golang.org/x/net/http2/hpack"
)

// refDecoder is what the observer used before attemptDecoder: x/net's
// decoder, emitting every field, keeping the last attempt header.
type refDecoder struct {
	dec   *hpack.Decoder
	found string
}

func newRefDecoder() *refDecoder {
	r := &refDecoder{}
	r.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == attemptHeaderLower {
			r.found = f.Value
		}
	})
	r.dec.SetAllowedMaxDynamicTableSize(maxDecoderTable)
	return r
}

func (r *refDecoder) decode(block []byte) (string, error) {
	r.found = ""
	if _, err := r.dec.Write(block); err != nil {
		return "", err
	}
	if err := r.dec.Close(); err != nil {
		return "", err
	}
	return r.found, nil
}

// decodeBoth feeds blocks to both decoders and fails at the first
// disagreement: one fails where the other does not, or they find a
// different attempt header value. It stops after the first error and
// returns what was found in each block decoded, and that error.
func decodeBoth(t *testing.T, blocks [][]byte) (found []string, err error) {
	t.Helper()
	ref, got := newRefDecoder(), newAttemptDecoder(attemptHeaderLower, 4096, maxDecoderTable)
	for i, b := range blocks {
		want, werr := ref.decode(b)
		have, herr := got.decode(b)
		if (werr != nil) != (herr != nil) {
			t.Fatalf("block %d (% x): x/net error %v, attemptDecoder error %v", i, b, werr, herr)
		}
		if werr != nil {
			return found, herr
		}
		if want != have {
			t.Fatalf("block %d: x/net found %q, attemptDecoder %q", i, want, have)
		}
		found = append(found, have)
	}
	return found, nil
}

// Header lists as an HTTP/2 client sends them, encoded by x/net's own
// encoder with table size changes, sensitive fields, repeated and unique
// attempt ids and names that collide with the attempt header's prefix.
func TestAttemptDecoderMatchesXNet(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var buf bytes.Buffer
		enc := hpack.NewEncoder(&buf)
		var blocks [][]byte
		var wantIDs []string
		for req := range 300 {
			if rng.IntN(40) == 0 {
				// A SETTINGS_HEADER_TABLE_SIZE change: the encoder emits a
				// size update at the start of its next block.
				enc.SetMaxDynamicTableSizeLimit(uint32(rng.IntN(8192)))
			}
			fields := []hpack.HeaderField{
				{Name: ":method", Value: "POST"},
				{Name: ":scheme", Value: "https"},
				{Name: ":authority", Value: "api.example:443"},
				{Name: ":path", Value: "/v1/chat/completions"},
				{Name: "content-type", Value: "application/json"},
				{Name: "authorization", Value: "Bearer sk-" + strconv.Itoa(rng.IntN(3)), Sensitive: rng.IntN(2) == 0},
				{Name: "idempotency-key", Value: "action-" + strconv.Itoa(req/2)},
				{Name: "x-durallm-attempt-not", Value: "decoy"},
			}
			id := "attempt-" + strconv.Itoa(req)
			if rng.IntN(5) == 0 {
				id = "attempt-reused" // indexed on repeat
			}
			if rng.IntN(10) != 0 { // sometimes no attempt header at all
				fields = append(fields, hpack.HeaderField{Name: attemptHeaderLower, Value: id, Sensitive: rng.IntN(8) == 0})
			} else {
				id = ""
			}
			wantIDs = append(wantIDs, id)
			if rng.IntN(4) == 0 {
				fields = append(fields, hpack.HeaderField{Name: "x-big", Value: string(bytes.Repeat([]byte{'v'}, rng.IntN(5000)))})
			}
			rng.Shuffle(len(fields)-4, func(i, j int) { fields[4+i], fields[4+j] = fields[4+j], fields[4+i] })
			buf.Reset()
			for _, f := range fields {
				if err := enc.WriteField(f); err != nil {
					t.Fatal(err)
				}
			}
			blocks = append(blocks, bytes.Clone(buf.Bytes()))
		}
		found, err := decodeBoth(t, blocks)
		if err != nil || len(found) != len(blocks) {
			t.Fatalf("seed %d: an encoder's own blocks failed after %d of %d: %v", seed, len(found), len(blocks), err)
		}
		for i, v := range found {
			if v != wantIDs[i] {
				t.Fatalf("seed %d block %d: found %q, sent %q", seed, i, v, wantIDs[i])
			}
		}
	}
}

// Hand-written blocks for the rules an encoder does not exercise.
func TestAttemptDecoderEdgeCases(t *testing.T) {
	lit := func(name, value string) []byte { // literal with incremental indexing, new name
		b := []byte{0x40, byte(len(name))}
		b = append(b, name...)
		b = append(b, byte(len(value)))
		return append(b, value...)
	}
	for _, tc := range []struct {
		name    string
		blocks  [][]byte
		fails   bool   // the last block is rejected
		lastHit string // else: what the last block yields
	}{
		{"indexed 0", [][]byte{{0x80}}, true, ""},
		{"index past the tables", [][]byte{{0xff, 0x00}}, true, ""},
		{"dynamic index after the entry was inserted", [][]byte{lit(attemptHeaderLower, "a1"), {0xbe}}, false, "a1"},
		{"name indexed from a matching dynamic entry", [][]byte{lit(attemptHeaderLower, "a1"), {0x7e, 0x02, 'a', '2'}, {0xbe}}, false, "a2"},
		{"static index never matches", [][]byte{{0x82}}, false, ""},
		{"size update late with an empty table", [][]byte{{0x82, 0x20}}, false, ""},
		{"size update late with entries", [][]byte{lit("x", "y"), {0x82, 0x20}}, true, ""},
		{"size update to the allowed maximum", [][]byte{{0x3f, 0xe1, 0xff, 0x03}}, false, ""},
		{"size update too large", [][]byte{{0x3f, 0xe2, 0xff, 0x03}}, true, ""},
		{"size update to 0 evicts everything", [][]byte{lit(attemptHeaderLower, "a1"), {0x20, 0xbe}}, true, ""},
		{"entry larger than the table is not kept", [][]byte{{0x3f, 0x11}, lit(attemptHeaderLower, "a-long-value"), {0xbe}}, true, ""},
		{"entry larger than the table is still found", [][]byte{{0x3f, 0x11}, lit(attemptHeaderLower, "a-long-value")}, false, "a-long-value"},
		{"truncated string", [][]byte{{0x40, 0x05, 'a'}}, true, ""},
		{"truncated varint", [][]byte{{0x7f}}, true, ""},
		{"varint overflow", [][]byte{{0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}}, true, ""},
		{"invalid Huffman", [][]byte{{0x40, 0x81, 0xff, 0x01, 'v'}}, true, ""},
		{"never indexed attempt header", [][]byte{append([]byte{0x10}, lit(attemptHeaderLower, "a9")[1:]...)}, false, "a9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found, err := decodeBoth(t, tc.blocks)
			if tc.fails {
				if err == nil || len(found) != len(tc.blocks)-1 {
					t.Fatalf("want the last block rejected; decoded %d of %d, err %v", len(found), len(tc.blocks), err)
				}
				return
			}
			if err != nil || len(found) != len(tc.blocks) || found[len(found)-1] != tc.lastHit {
				t.Fatalf("found %q, err %v; want %q from the last block", found, err, tc.lastHit)
			}
		})
	}
}

// FuzzAttemptDecoder holds attemptDecoder to x/net's decoder on arbitrary
// input: the same blocks fail, and the others yield the same attempt id.
// The input is split into blocks at each 0xa5 byte pair, so one input is a
// sequence of blocks sharing a table.
func FuzzAttemptDecoder(f *testing.F) {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for i := range 3 {
		_ = enc.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
		_ = enc.WriteField(hpack.HeaderField{Name: attemptHeaderLower, Value: "a-" + strconv.Itoa(i)})
		_ = enc.WriteField(hpack.HeaderField{Name: "idempotency-key", Value: "k"})
		buf.Write([]byte{0xa5, 0xa5})
	}
	f.Add(buf.Bytes())
	f.Add([]byte{0x3f, 0xe1, 0x1f, 0xa5, 0xa5, 0x82})
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = decodeBoth(t, bytes.Split(data, []byte{0xa5, 0xa5}))
	})
}

// BenchmarkObserverDecode compares the observer's decoder with x/net's
// (baseline) on the header blocks a client sends, one unique attempt id
// per request, so each block inserts one entry and evicts one:
//
//	go test -run '^$' -bench BenchmarkObserverDecode -benchmem ./recovery/
func BenchmarkObserverDecode(b *testing.B) {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	blocks := make([][]byte, 1024)
	for i := range blocks {
		buf.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
			{Name: ":authority", Value: "api.example:443"}, {Name: ":path", Value: "/v1/chat/completions"},
			{Name: "content-type", Value: "application/json"}, {Name: "authorization", Value: "Bearer sk-test"},
			{Name: "idempotency-key", Value: "action-" + strconv.Itoa(i)},
			{Name: attemptHeaderLower, Value: "0123456789abcdef-" + strconv.Itoa(i)},
		} {
			_ = enc.WriteField(f)
		}
		blocks[i] = bytes.Clone(buf.Bytes())
	}
	b.Run("baseline=x-net", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			d := newRefDecoder()
			for _, blk := range blocks {
				if _, err := d.decode(blk); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(blocks)), "ns/block")
	})
	b.Run("attemptDecoder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			d := newAttemptDecoder(attemptHeaderLower, 4096, maxDecoderTable)
			for _, blk := range blocks {
				if _, err := d.decode(blk); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(blocks)), "ns/block")
	})
}
