package codec

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/proto"
)

const canary = "CANARY-prompt-9f27c1e4-do-not-store"

type prompt struct {
	Model    string
	Messages []string
	MaxToks  int
}

// samplePayloads are what the default converter makes of typical values.
func samplePayloads(t *testing.T) []*commonpb.Payload {
	t.Helper()
	ps, err := converter.GetDefaultDataConverter().ToPayloads(
		canary,
		prompt{Model: "m", Messages: []string{"system", canary}, MaxToks: 64},
		42,
		nil,
		[]byte(canary),
		"",
	)
	if err != nil {
		t.Fatal(err)
	}
	return ps.Payloads
}

func clonePayloads(ps []*commonpb.Payload) []*commonpb.Payload {
	out := make([]*commonpb.Payload, len(ps))
	for i, p := range ps {
		out[i] = proto.Clone(p).(*commonpb.Payload)
	}
	return out
}

func assertSamePayloads(t *testing.T, got, want []*commonpb.Payload) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d payloads, want %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("payload %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestCodecRoundTrip(t *testing.T) {
	_, k1 := newKey(t)
	c := NewCodec(mustKeyring(t, "k1:"+k1))
	orig := samplePayloads(t)
	before := clonePayloads(orig)

	enc, err := c.Encode(orig)
	if err != nil {
		t.Fatal(err)
	}
	assertSamePayloads(t, orig, before) // inputs untouched
	for i, p := range enc {
		md := p.GetMetadata()
		if string(md[converter.MetadataEncoding]) != EncodingEncrypted ||
			string(md[MetadataKeyID]) != "k1" ||
			string(md[MetadataCipher]) != CipherAES256GCM || len(md) != 3 {
			t.Fatalf("payload %d metadata = %q", i, md)
		}
	}

	dec, err := c.Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	assertSamePayloads(t, dec, before)

	// An empty batch is valid for both directions.
	if out, err := c.Encode(nil); err != nil || len(out) != 0 {
		t.Fatalf("Encode(nil) = %v, %v", out, err)
	}
	if out, err := c.Decode([]*commonpb.Payload{}); err != nil || len(out) != 0 {
		t.Fatalf("Decode(empty) = %v, %v", out, err)
	}
}

func TestEncryptedDataHidesPlaintext(t *testing.T) {
	_, k1 := newKey(t)
	c := NewCodec(mustKeyring(t, "k1:"+k1))
	orig := samplePayloads(t)
	enc, err := c.Encode(orig)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range enc {
		// The whole stored form, metadata included, as history keeps it.
		wire, err := proto.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(wire, []byte(canary)) || bytes.Contains(wire, []byte("json/plain")) {
			t.Fatalf("payload %d stores plaintext or its encoding: %q", i, wire)
		}
	}
	// Random nonces: the same input never encrypts the same way twice.
	again, err := c.Encode(orig)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(enc[0].GetData(), again[0].GetData()) {
		t.Fatal("two encryptions of one payload are identical")
	}
}

func TestDecodeAfterRotation(t *testing.T) {
	_, oldKey := newKey(t)
	_, newKey := newKey(t)
	before := mustKeyring(t, "old:"+oldKey)
	after := mustKeyring(t, "new:"+newKey+";old:"+oldKey)

	orig := samplePayloads(t)
	written, err := NewCodec(before).Encode(orig)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := NewCodec(after).Decode(written)
	if err != nil {
		t.Fatalf("rotated keyring cannot read old history: %v", err)
	}
	assertSamePayloads(t, dec, orig)

	fresh, err := NewCodec(after).Encode(orig)
	if err != nil {
		t.Fatal(err)
	}
	if id := string(fresh[0].GetMetadata()[MetadataKeyID]); id != "new" {
		t.Fatalf("rotated keyring encrypts with %q, want the active key", id)
	}

	// A process still on the old keyring names the key it lacks.
	_, err = NewCodec(before).Decode(fresh)
	if !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("err = %v, want ErrUnknownKey", err)
	}
	var pe *PayloadError
	if !errors.As(err, &pe) || pe.KeyID != "new" || pe.Op != "decrypt" || !strings.Contains(err.Error(), `"new"`) {
		t.Fatalf("err = %#v, want a PayloadError naming key id new", err)
	}
	assertNoMaterial(t, err.Error(), oldKey, newKey, canary)
}

func TestDecodeRejectsTamperedPayloads(t *testing.T) {
	_, k1 := newKey(t)
	_, k2 := newKey(t)
	// "twin" is k1's key under another id: only the additional data tells
	// them apart, so re-labelling to it must still fail.
	keys := mustKeyring(t, "k1:"+k1+";k2:"+k2+";twin:"+k1)
	c := NewCodec(keys)
	enc, err := c.Encode(samplePayloads(t)[:1])
	if err != nil {
		t.Fatal(err)
	}
	good := enc[0]

	mutate := func(f func(p *commonpb.Payload)) *commonpb.Payload {
		p := proto.Clone(good).(*commonpb.Payload)
		f(p)
		return p
	}
	cases := []struct {
		name  string
		p     *commonpb.Payload
		want  error
		keyID string
	}{
		{"flipped ciphertext byte", mutate(func(p *commonpb.Payload) { p.Data[nonceSize+3] ^= 1 }), ErrAuthentication, "k1"},
		{"flipped tag byte", mutate(func(p *commonpb.Payload) { p.Data[len(p.Data)-1] ^= 0x80 }), ErrAuthentication, "k1"},
		{"flipped nonce byte", mutate(func(p *commonpb.Payload) { p.Data[0] ^= 1 }), ErrAuthentication, "k1"},
		{"re-labelled to another key", mutate(func(p *commonpb.Payload) { p.Metadata[MetadataKeyID] = []byte("k2") }), ErrAuthentication, "k2"},
		{"re-labelled to the same key under another id", mutate(func(p *commonpb.Payload) { p.Metadata[MetadataKeyID] = []byte("twin") }), ErrAuthentication, "twin"},
		{"re-labelled to an unknown id", mutate(func(p *commonpb.Payload) { p.Metadata[MetadataKeyID] = []byte("gone") }), ErrUnknownKey, "gone"},
		{"key id removed", mutate(func(p *commonpb.Payload) { delete(p.Metadata, MetadataKeyID) }), ErrMalformedPayload, ""},
		{"other cipher", mutate(func(p *commonpb.Payload) { p.Metadata[MetadataCipher] = []byte("ROT13") }), ErrUnsupportedCipher, "k1"},
		{"truncated", mutate(func(p *commonpb.Payload) { p.Data = p.Data[:nonceSize+4] }), ErrMalformedPayload, "k1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := c.Decode([]*commonpb.Payload{samplePayloads(t)[2], tc.p})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decode = %v, %v; want %v", out, err, tc.want)
			}
			var pe *PayloadError
			if !errors.As(err, &pe) || pe.KeyID != tc.keyID || pe.Index != 1 {
				t.Fatalf("err = %#v, want PayloadError index 1 key id %q", err, tc.keyID)
			}
			if tc.keyID != "" && !strings.Contains(err.Error(), tc.keyID) {
				t.Fatalf("error %q does not name key id %q", err, tc.keyID)
			}
			assertNoMaterial(t, err.Error(), k1, k2, canary)
		})
	}
}

func TestDecodePassesUnencryptedPayloadsThrough(t *testing.T) {
	_, k1 := newKey(t)
	c := NewCodec(mustKeyring(t, "k1:"+k1))
	plain := samplePayloads(t)
	zipped, err := converter.NewZlibCodec(converter.ZlibCodecOptions{AlwaysEncode: true}).Encode(plain[:1])
	if err != nil {
		t.Fatal(err)
	}
	noMetadata := &commonpb.Payload{Data: []byte("raw")}
	in := append(append(plain, zipped...), noMetadata)

	out, err := c.Decode(in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if out[i] != in[i] {
			t.Fatalf("payload %d was replaced: %v", i, out[i])
		}
	}
}

func TestZeroKeyringCannotEncrypt(t *testing.T) {
	_, err := NewCodec(&Keyring{}).Encode(samplePayloads(t))
	if !errors.Is(err, ErrNoActiveKey) {
		t.Fatalf("err = %v, want ErrNoActiveKey", err)
	}
}

func TestDataConverterRoundTripsStruct(t *testing.T) {
	_, k1 := newKey(t)
	dc := DataConverter(mustKeyring(t, "k1:"+k1))
	in := prompt{Model: "gpt", Messages: []string{"hello", canary}, MaxToks: 7}

	p, err := dc.ToPayload(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(p.GetMetadata()[converter.MetadataEncoding]) != EncodingEncrypted {
		t.Fatalf("ToPayload metadata = %q, want encrypted", p.GetMetadata())
	}
	if bytes.Contains(p.GetData(), []byte(canary)) {
		t.Fatal("ToPayload stored the plaintext")
	}
	var out prompt
	if err := dc.FromPayload(p, &out); err != nil {
		t.Fatal(err)
	}
	if out.Model != in.Model || strings.Join(out.Messages, "|") != strings.Join(in.Messages, "|") || out.MaxToks != in.MaxToks {
		t.Fatalf("FromPayload = %+v, want %+v", out, in)
	}

	ps, err := dc.ToPayloads(in, "second", 3)
	if err != nil {
		t.Fatal(err)
	}
	var (
		got1 prompt
		got2 string
		got3 int
	)
	if err := dc.FromPayloads(ps, &got1, &got2, &got3); err != nil {
		t.Fatal(err)
	}
	if got1.Model != "gpt" || got2 != "second" || got3 != 3 {
		t.Fatalf("FromPayloads = %+v %q %d", got1, got2, got3)
	}
	// ToString is what tools print; it must show the decrypted value.
	if s := dc.ToString(p); !strings.Contains(s, canary) {
		t.Fatalf("ToString = %q, want the decrypted value", s)
	}
}

func TestCodecConcurrentUse(t *testing.T) {
	_, k1 := newKey(t)
	c := NewCodec(mustKeyring(t, "k1:"+k1))
	orig := samplePayloads(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for range 50 {
				enc, err := c.Encode(orig)
				if err != nil {
					errs <- err
					return
				}
				if _, err := c.Decode(enc); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
