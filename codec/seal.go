package codec

import (
	"bytes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
)

// sealMagic starts every blob Seal writes. Data outside Temporal (the
// attempt journal, the result store) has no payload metadata to say it is
// encrypted; the magic does, so a reader tells sealed data from data
// stored in the clear. The bytes are part of the stored format.
var sealMagic = []byte("DLSEAL1\x00")

// Seal encrypts plain for storage outside Temporal with the keyring's
// active key: AES-256-GCM, as NewCodec, with the key id and where the blob
// belongs (place: an attempt id, a result reference) as additional data,
// so a blob cannot be re-labelled to another key or moved to another
// place. The blob is sealMagic, the key id's length (one byte) and the
// id, then nonce||ciphertext. Errors wrap ErrNoActiveKey.
func (k *Keyring) Seal(plain, place []byte) ([]byte, error) {
	id := k.active
	aead := k.aeads[id]
	if aead == nil {
		return nil, fmt.Errorf("codec: seal: %w", ErrNoActiveKey)
	}
	head := make([]byte, 0, len(sealMagic)+1+len(id))
	head = append(append(append(head, sealMagic...), byte(len(id))), id...)
	return sealWith(aead, head, plain, sealAD(id, place))
}

// Open decrypts a blob Seal wrote for the same place, with whichever key
// of the ring sealed it. Errors wrap ErrUnknownKey (an old key that is no
// longer in the ring), ErrAuthentication (another place, a wrong key or
// changed data) or ErrMalformedPayload. They never carry the data.
func (k *Keyring) Open(blob, place []byte) ([]byte, error) {
	if !Sealed(blob) {
		return nil, fmt.Errorf("codec: open: %w: not a sealed blob", ErrMalformedPayload)
	}
	rest := blob[len(sealMagic):]
	if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
		return nil, fmt.Errorf("codec: open: %w: truncated key id", ErrMalformedPayload)
	}
	id := string(rest[1 : 1+int(rest[0])])
	aead, ok := k.aeads[id]
	if !ok {
		return nil, fmt.Errorf("codec: open with key id %q: %w", truncate(id, 64), ErrUnknownKey)
	}
	plain, err := openWith(aead, rest[1+len(id):], sealAD(id, place))
	if err != nil {
		return nil, fmt.Errorf("codec: open with key id %q: %w", id, err)
	}
	return plain, nil
}

// Sealed reports whether b is a blob Seal wrote (by its magic).
func Sealed(b []byte) bool { return bytes.HasPrefix(b, sealMagic) }

func sealAD(id string, place []byte) []byte {
	return append(append([]byte(id), 0), place...)
}

// sealWith appends nonce||ciphertext of plain to dst: the one place a
// nonce is drawn and GCM sealed, for payloads and blobs alike.
func sealWith(aead cipher.AEAD, dst, plain, ad []byte) ([]byte, error) {
	n := len(dst)
	out := make([]byte, n+nonceSize, n+nonceSize+len(plain)+aead.Overhead())
	copy(out, dst)
	if _, err := rand.Read(out[n:]); err != nil {
		return nil, fmt.Errorf("read nonce: %w", err)
	}
	return aead.Seal(out, out[n:], plain, ad), nil
}

// openWith opens nonce||ciphertext.
func openWith(aead cipher.AEAD, data, ad []byte) ([]byte, error) {
	if len(data) < nonceSize+aead.Overhead() {
		return nil, fmt.Errorf("%w: %d bytes is shorter than nonce and tag", ErrMalformedPayload, len(data))
	}
	plain, err := aead.Open(nil, data[:nonceSize], data[nonceSize:], ad)
	if err != nil {
		// The GCM error says nothing useful and nothing secret; the
		// sentinel says what it means.
		return nil, ErrAuthentication
	}
	return plain, nil
}
