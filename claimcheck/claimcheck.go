package claimcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/proto"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/resultstore"
)

const (
	// DefaultThreshold is the payload size, in bytes, above which a
	// payload is stored when Options.Threshold is zero: small enough that
	// a reference is what history holds for anything that grows with a
	// conversation, large enough that the workflows' own records (a
	// status, a short answer) stay readable in history.
	DefaultThreshold = 2 << 10
	// InlineLimit is Temporal's default limit on one payload (2 MiB): the
	// SDK fails a workflow task that carries a larger one, and the server
	// refuses it from a client.
	InlineLimit = 2 << 20
	// DefaultTimeout bounds one store call when Options.Timeout is zero.
	DefaultTimeout = 30 * time.Second
	// EncodingReference is the "encoding" metadata of a payload that is a
	// reference; its data is JSON {"ref": ..., "size": ...}. The value is
	// part of the history format.
	EncodingReference = "json/durallm-reference"
)

// ErrMalformedReference is returned (wrapped) for a reference payload
// whose data is not a reference.
var ErrMalformedReference = errors.New("claimcheck: malformed reference payload")

// Options configures DataConverter and NewCodec. The zero value stores
// payloads over DefaultThreshold, unencrypted by the converter.
type Options struct {
	// Threshold is the size of a payload, in bytes as Temporal counts
	// them, above which it is stored. Zero means DefaultThreshold.
	Threshold int
	// Keys, when set, encrypts every payload (codec.NewCodec), references
	// included, after the large ones are stored. Nil means none.
	Keys *codec.Keyring
	// Timeout bounds one store call. Zero means DefaultTimeout.
	Timeout time.Duration
	// Logger receives a warning when a payload travels inline because the
	// store failed (its size and the error, never its content). Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Inline is a value the converter keeps in history up to InlineLimit,
// whatever Options.Threshold says: one that programs without this
// converter read, such as a workflow's result an app in another language
// waits for, or a parent dialed without it. workflows.ActionResult and
// workflows.Status are. A larger one is stored all the same.
type Inline interface{ InlineInHistory() }

// thresholds is each value's threshold: InlineLimit for an Inline one.
func (s *store) thresholds(values []any) []int {
	out := make([]int, len(values))
	for i, v := range values {
		out[i] = s.threshold
		if _, ok := v.(Inline); ok {
			out[i] = InlineLimit
		}
	}
	return out
}

// reference is a reference payload's data.
type reference struct {
	// Ref is the store's reference: its scheme and the stored bytes'
	// SHA-256.
	Ref string `json:"ref"`
	// Size is the stored bytes' length.
	Size int `json:"size"`
}

// store is what every converter of one DataConverter call shares.
type store struct {
	s         resultstore.Store
	threshold int
	limit     int64
	timeout   time.Duration
	log       *slog.Logger
}

func newStore(s resultstore.Store, o Options) *store {
	if s == nil {
		panic("claimcheck: nil store")
	}
	st := &store{s: s, threshold: o.Threshold, limit: resultstore.LimitOf(s), timeout: o.Timeout, log: o.Logger}
	if st.threshold <= 0 {
		st.threshold = DefaultThreshold
	}
	if st.timeout <= 0 {
		st.timeout = DefaultTimeout
	}
	if st.log == nil {
		st.log = slog.Default()
	}
	return st
}

// put stores data claimed for ids: once, for all of them, when the store
// can; unclaimed (never swept) when there is no id or the store cannot
// expire what it keeps.
func (s *store) put(ctx context.Context, ids []string, data []byte) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	switch st := s.s.(type) {
	case resultstore.ClaimsAll:
		return st.PutForAll(ctx, ids, data)
	case resultstore.Expirable:
		if len(ids) == 0 {
			return st.Put(ctx, data)
		}
		var ref string
		for _, id := range ids {
			var err error
			if ref, err = st.PutFor(ctx, id, data); err != nil {
				return "", err
			}
		}
		return ref, nil
	}
	return s.s.Put(ctx, data)
}

// encode replaces each payload over the threshold with a reference to it.
// An error is one a retry cannot mend (ErrTooLarge), or a store failure
// for a payload too large to travel inline.
// thresholds, when as long as ps, is each payload's (thresholds); else
// every payload's is Options.Threshold.
func (s *store) encode(ctx context.Context, ids []string, ps []*commonpb.Payload, thresholds []int) ([]*commonpb.Payload, error) {
	var out []*commonpb.Payload
	for i, p := range ps {
		threshold := s.threshold
		if len(thresholds) == len(ps) {
			threshold = thresholds[i]
		}
		if proto.Size(p) <= threshold {
			continue
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("claimcheck: payload %d: %w", i, err)
		}
		if err := resultstore.CheckSize(int64(len(b)), s.limit); err != nil {
			return nil, fmt.Errorf("claimcheck: payload %d: %w", i, err)
		}
		ref, err := s.put(ctx, ids, b)
		if err != nil {
			if len(b) <= InlineLimit {
				s.log.Warn("claimcheck: a payload travels inline: the result store failed", "bytes", len(b), "error", err)
				continue
			}
			return nil, &storeError{fmt.Errorf("claimcheck: store payload %d (%d bytes): %w", i, len(b), err)}
		}
		data, _ := json.Marshal(reference{Ref: ref, Size: len(b)})
		if out == nil {
			out = slices.Clone(ps)
		}
		out[i] = &commonpb.Payload{Metadata: map[string][]byte{converter.MetadataEncoding: []byte(EncodingReference)}, Data: data}
	}
	if out == nil {
		return ps, nil
	}
	return out, nil
}

// decode replaces each reference with the payload it names, checked
// against its digest.
func (s *store) decode(ctx context.Context, ps []*commonpb.Payload) ([]*commonpb.Payload, error) {
	var out []*commonpb.Payload
	for i, p := range ps {
		if string(p.GetMetadata()[converter.MetadataEncoding]) != EncodingReference {
			continue
		}
		orig, err := s.resolve(ctx, p)
		if err != nil {
			return nil, &storeError{fmt.Errorf("claimcheck: payload %d: %w", i, err)}
		}
		if out == nil {
			out = slices.Clone(ps)
		}
		out[i] = orig
	}
	if out == nil {
		return ps, nil
	}
	return out, nil
}

func (s *store) resolve(ctx context.Context, p *commonpb.Payload) (*commonpb.Payload, error) {
	var r reference
	if err := json.Unmarshal(p.GetData(), &r); err != nil || r.Ref == "" {
		return nil, ErrMalformedReference
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	b, err := s.s.Get(ctx, r.Ref)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", r.Ref, err)
	}
	var orig commonpb.Payload
	if err := proto.Unmarshal(b, &orig); err != nil {
		return nil, fmt.Errorf("%w: %s does not hold a payload: %w", ErrMalformedReference, r.Ref, err)
	}
	return &orig, nil
}

// storeError is a failure to read or write the store: inside workflow
// code it fails the workflow task (a panic), so that Temporal retries it,
// instead of failing the workflow.
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// NewCodec returns the PayloadCodec of references, for a codec server
// (codec.HandlerOptions.References): Decode resolves references from s,
// Encode changes nothing (a payload the UI or CLI encodes stays inline).
// Options.Keys is not used: the codec server decrypts first.
func NewCodec(s resultstore.Store, o Options) converter.PayloadCodec {
	return resolver{newStore(s, o)}
}

type resolver struct{ s *store }

func (r resolver) Encode(ps []*commonpb.Payload) ([]*commonpb.Payload, error) { return ps, nil }

func (r resolver) Decode(ps []*commonpb.Payload) ([]*commonpb.Payload, error) {
	return r.s.decode(context.Background(), ps)
}
