package codec

import (
	"errors"
	"fmt"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/proto"
)

// Payload metadata written by the codec. The values are part of the history
// format: changing them makes existing history undecodable.
const (
	// EncodingEncrypted is the "encoding" metadata value of an encrypted
	// payload; only payloads carrying it are decrypted.
	EncodingEncrypted = "binary/encrypted"
	// MetadataKeyID names the keyring entry that encrypted the payload.
	MetadataKeyID = "encryption-key-id"
	// MetadataCipher names the algorithm, so a future cipher can be told
	// apart from this one.
	MetadataCipher = "encryption-cipher"
	// CipherAES256GCM is the only cipher this package writes and reads.
	CipherAES256GCM = "AES-256-GCM"
)

// nonceSize is the standard GCM nonce length. Nonces are random, which is
// safe for about 2^32 payloads per key (NIST SP 800-38D); rotate keys well
// before that.
const nonceSize = 12

// Errors from the codec's Encode and Decode, matched with errors.Is. They
// come wrapped in a *PayloadError.
var (
	// ErrNoActiveKey means Encode was given a zero Keyring.
	ErrNoActiveKey = errors.New("keyring has no active key")
	// ErrUnknownKey means a payload names a key id the keyring does not
	// hold: load the old key as a non-active line to read it.
	ErrUnknownKey = errors.New("unknown encryption key id")
	// ErrAuthentication means GCM authentication failed: the key is wrong,
	// the data was changed, or the payload was re-labelled with another id.
	ErrAuthentication = errors.New("payload failed authentication (wrong key, tampered data or re-labelled key id)")
	// ErrUnsupportedCipher means the payload names a cipher other than
	// CipherAES256GCM.
	ErrUnsupportedCipher = errors.New("unsupported encryption cipher")
	// ErrMalformedPayload means an encrypted payload is missing metadata,
	// is too short, or does not decrypt to a Payload.
	ErrMalformedPayload = errors.New("malformed encrypted payload")
)

// PayloadError says which payload of a batch failed and with which key. It
// never carries payload data.
type PayloadError struct {
	// Op is "encrypt" or "decrypt".
	Op string
	// Index is the payload's position in the batch.
	Index int
	// KeyID is the key involved, as found in the keyring or in the payload's
	// metadata (truncated to 64 bytes); "" if the payload named none.
	KeyID string
	// Err is one of the Err* sentinels, possibly joined with a detail.
	Err error
}

// Error implements error.
func (e *PayloadError) Error() string {
	if e.KeyID == "" {
		return fmt.Sprintf("codec: %s payload %d: %v", e.Op, e.Index, e.Err)
	}
	return fmt.Sprintf("codec: %s payload %d with key id %q: %v", e.Op, e.Index, e.KeyID, e.Err)
}

// Unwrap lets errors.Is find the sentinel.
func (e *PayloadError) Unwrap() error { return e.Err }

// payloadCodec is AES-256-GCM over whole marshalled payloads.
type payloadCodec struct{ keys *Keyring }

// NewCodec returns a PayloadCodec that encrypts every payload with the
// keyring's active key and decrypts payloads made with any key in it.
//
// Encode marshals the whole payload, metadata included (so the original
// encoding is hidden too), and seals it with a random 12-byte nonce and
// the key id as additional data; the result has metadata
// encoding=EncodingEncrypted, MetadataKeyID and MetadataCipher, and data
// nonce||ciphertext. Decode touches only payloads whose encoding is
// EncodingEncrypted and passes every other payload through unchanged, so
// history written before encryption was turned on stays readable.
//
// k must not be nil. The codec is safe for concurrent use and never
// modifies its arguments. Errors are *PayloadError.
func NewCodec(k *Keyring) converter.PayloadCodec {
	if k == nil {
		panic("codec: NewCodec with nil Keyring")
	}
	return &payloadCodec{keys: k}
}

// DataConverter returns the SDK's default data converter with NewCodec(k)
// applied to every payload, for client.Options.DataConverter on both the
// worker and every client that starts or reads workflows.
func DataConverter(k *Keyring) converter.DataConverter {
	return converter.NewCodecDataConverter(converter.GetDefaultDataConverter(), NewCodec(k))
}

// Encode implements converter.PayloadCodec.
func (c *payloadCodec) Encode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	id := c.keys.active
	aead := c.keys.aeads[id]
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		fail := func(err error) ([]*commonpb.Payload, error) {
			return nil, &PayloadError{Op: "encrypt", Index: i, KeyID: id, Err: err}
		}
		if aead == nil {
			return fail(ErrNoActiveKey)
		}
		plain, err := proto.Marshal(p)
		if err != nil {
			return fail(fmt.Errorf("marshal payload: %w", err))
		}
		data, err := sealWith(aead, nil, plain, []byte(id))
		if err != nil {
			return fail(err)
		}
		out[i] = &commonpb.Payload{
			Metadata: map[string][]byte{
				converter.MetadataEncoding: []byte(EncodingEncrypted),
				MetadataKeyID:              []byte(id),
				MetadataCipher:             []byte(CipherAES256GCM),
			},
			Data: data,
		}
	}
	return out, nil
}

// Decode implements converter.PayloadCodec.
func (c *payloadCodec) Decode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		md := p.GetMetadata()
		if string(md[converter.MetadataEncoding]) != EncodingEncrypted {
			out[i] = p
			continue
		}
		id := string(md[MetadataKeyID])
		fail := func(err error) ([]*commonpb.Payload, error) {
			return nil, &PayloadError{Op: "decrypt", Index: i, KeyID: truncate(id, 64), Err: err}
		}
		if id == "" {
			return fail(fmt.Errorf("%w: no %s metadata", ErrMalformedPayload, MetadataKeyID))
		}
		if name := string(md[MetadataCipher]); name != CipherAES256GCM {
			return fail(fmt.Errorf("%w: %q", ErrUnsupportedCipher, truncate(name, 64)))
		}
		aead, ok := c.keys.aeads[id]
		if !ok {
			return fail(ErrUnknownKey)
		}
		plain, err := openWith(aead, p.GetData(), []byte(id))
		if err != nil {
			return fail(err)
		}
		var orig commonpb.Payload
		if err := proto.Unmarshal(plain, &orig); err != nil {
			return fail(fmt.Errorf("%w: %w", ErrMalformedPayload, err))
		}
		out[i] = &orig
	}
	return out, nil
}

// truncate keeps error messages bounded when metadata is hostile.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
