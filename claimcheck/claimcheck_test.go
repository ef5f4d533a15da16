package claimcheck_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/durallm/durallm/claimcheck"
	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/codec/codectest"
	"github.com/durallm/durallm/resultstore"
)

var quiet = slog.New(slog.DiscardHandler)

func dirStore(t *testing.T) resultstore.Dir {
	return resultstore.Dir{Path: filepath.Join(t.TempDir(), "results")}
}

// forWorkflow is dc as a client starting workflow id uses it.
func forWorkflow(dc converter.DataConverter, id string) converter.DataConverter {
	dc = dc.(converter.ContextAware).WithContext(context.Background())
	return converter.WithDataConverterSerializationContext(dc, converter.WorkflowSerializationContext{Namespace: "default", WorkflowID: id})
}

// text is a JSON string of n bytes.
func text(n int) string { return strings.Repeat("x", n-2) }

// sized is a string whose payload is n bytes as Temporal counts them.
func sized(t *testing.T, n int) string {
	t.Helper()
	for m := n; m > 0; m-- {
		p, err := converter.GetDefaultDataConverter().ToPayload(text(m))
		if err != nil {
			t.Fatal(err)
		}
		if proto.Size(p) == n {
			return text(m)
		}
	}
	t.Fatalf("no string makes a %d-byte payload", n)
	return ""
}

func claims(t *testing.T, s resultstore.Expirable) map[string][]string {
	t.Helper()
	got := map[string][]string{}
	err := s.Older(context.Background(), time.Now().Add(time.Hour), func(c resultstore.Claim) error {
		got[c.Ref] = append(got[c.Ref], c.ActionRef)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// refOf is the reference a payload of v gets in a Dir: the digest of the
// payload the default converter makes of it.
func refOf(t *testing.T, v any) string {
	t.Helper()
	p, err := converter.GetDefaultDataConverter().ToPayload(v)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return resultstore.Ref("file", b)
}

// A payload up to the threshold stays in history; one above it is
// stored, history holding a reference of a few hundred bytes that names
// its digest, and it reads back the same.
func TestThresholdDecidesWhatIsStored(t *testing.T) {
	store := dirStore(t)
	dc := forWorkflow(claimcheck.DataConverter(store, claimcheck.Options{Threshold: 1000, Logger: quiet}), "action-1")
	for _, tc := range []struct {
		name   string
		value  string
		stored bool
	}{
		{"small", "hello", false},
		{"at the threshold", sized(t, 1000), false},
		{"over it", sized(t, 1001), true},
		{"a megabyte", text(1 << 20), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := dc.ToPayload(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			enc := string(p.GetMetadata()[converter.MetadataEncoding])
			if stored := enc == claimcheck.EncodingReference; stored != tc.stored {
				t.Fatalf("%d bytes: stored %v, want %v (encoding %s)", len(tc.value), stored, tc.stored, enc)
			}
			if tc.stored {
				var r struct {
					Ref  string `json:"ref"`
					Size int    `json:"size"`
				}
				if err := json.Unmarshal(p.GetData(), &r); err != nil || r.Ref != refOf(t, tc.value) || r.Size < len(tc.value) {
					t.Fatalf("reference %s: %v", p.GetData(), err)
				}
				if n := proto.Size(p); n > 300 {
					t.Fatalf("the reference is %d bytes", n)
				}
			}
			var back string
			if err := dc.FromPayload(p, &back); err != nil || back != tc.value {
				t.Fatalf("read back %d bytes: %v", len(back), err)
			}
		})
	}
	// What a client starting an action stores is claimed for the action.
	got := claims(t, store)
	if c := got[refOf(t, text(1<<20))]; len(c) != 1 || c[0] != "action-1" {
		t.Fatalf("claims %v", got)
	}
}

// inlineValue is an Inline value: one that others read from history.
type inlineValue struct {
	Text string `json:"text"`
}

func (inlineValue) InlineInHistory() {}

// A value others read from history (claimcheck.Inline) stays there up to
// Temporal's own limit; past it, it is stored all the same.
func TestAnInlineValueStaysInHistoryUpToTemporalsLimit(t *testing.T) {
	dc := forWorkflow(claimcheck.DataConverter(dirStore(t), claimcheck.Options{Logger: quiet}), "action-1")
	for _, tc := range []struct {
		n      int
		stored bool
	}{{100 << 10, false}, {claimcheck.InlineLimit, true}} {
		ps, err := dc.ToPayloads(inlineValue{text(tc.n)}, text(tc.n))
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{tc.stored, true} {
			if got := string(ps.GetPayloads()[i].GetMetadata()[converter.MetadataEncoding]) == claimcheck.EncodingReference; got != want {
				t.Fatalf("%d bytes, payload %d: stored %v, want %v", tc.n, i, got, want)
			}
		}
		p, err := dc.ToPayload(&inlineValue{text(tc.n)})
		if err != nil || (string(p.GetMetadata()[converter.MetadataEncoding]) == claimcheck.EncodingReference) != tc.stored {
			t.Fatalf("%d bytes by pointer: %v", tc.n, err)
		}
	}
}

// storedRef is the reference a stored payload names.
func storedRef(t *testing.T, p *commonpb.Payload) string {
	t.Helper()
	var r struct {
		Ref string `json:"ref"`
	}
	if err := json.Unmarshal(p.GetData(), &r); err != nil {
		t.Fatal(err)
	}
	return r.Ref
}

// A stored payload whose bytes changed, or that is gone, is an error
// naming what happened, never a wrong value.
func TestATamperedOrMissingBlobIsAnError(t *testing.T) {
	store := dirStore(t)
	dc := forWorkflow(claimcheck.DataConverter(store, claimcheck.Options{Logger: quiet}), "action-1")
	p, err := dc.ToPayload(text(10 << 10))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(store.Path, strings.TrimPrefix(storedRef(t, p), "file:"))
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Replace(b, []byte("xxxx"), []byte("yyyy"), 1)
	if err := os.WriteFile(file, tampered, 0o600); err != nil {
		t.Fatal(err)
	}
	var s string
	if err := dc.FromPayload(p, &s); !errors.Is(err, resultstore.ErrDamaged) {
		t.Fatalf("tampered: %v", err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := dc.FromPayload(p, &s); !errors.Is(err, resultstore.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	bad := &commonpb.Payload{Metadata: map[string][]byte{converter.MetadataEncoding: []byte(claimcheck.EncodingReference)}, Data: []byte("nope")}
	if err := dc.FromPayload(bad, &s); !errors.Is(err, claimcheck.ErrMalformedReference) {
		t.Fatalf("malformed: %v", err)
	}
}

// A payload over the store's limit is one error, ErrTooLarge, and
// nothing is stored.
func TestAPayloadOverTheStoresLimitIsErrTooLarge(t *testing.T) {
	store := dirStore(t)
	store.MaxBytes = 64 << 10
	dc := forWorkflow(claimcheck.DataConverter(store, claimcheck.Options{Logger: quiet}), "action-1")
	for _, n := range []int{64<<10 + 1, 1 << 20, 40 << 20} {
		if _, err := dc.ToPayloads("small", text(n)); !errors.Is(err, resultstore.ErrTooLarge) {
			t.Fatalf("%d bytes: %v", n, err)
		}
	}
	if entries, _ := os.ReadDir(store.Path); len(entries) != 0 {
		t.Fatalf("stored %d entries", len(entries))
	}
}

// With keys, history holds encrypted references and the store, given
// the same keys, seals what it keeps: neither holds the text.
func TestWithKeysNeitherHistoryNorTheStoreHoldTheText(t *testing.T) {
	keys := codectest.Ring(t, codectest.Line(t, "k1"))
	store := dirStore(t)
	store.Keys = keys
	dc := forWorkflow(claimcheck.DataConverter(store, claimcheck.Options{Keys: keys, Logger: quiet}), "action-1")
	secret := strings.Repeat("the user's secret question ", 1000)
	ps, err := dc.ToPayloads("a small secret", secret)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range ps.GetPayloads() {
		if string(p.GetMetadata()[converter.MetadataEncoding]) != codec.EncodingEncrypted || bytes.Contains(p.GetData(), []byte("secret")) {
			t.Fatalf("payload %d in history: %s", i, p.GetMetadata())
		}
	}
	entries, _ := os.ReadDir(store.Path)
	blobs := 0
	for _, e := range entries {
		if e.Type().IsRegular() {
			blobs++
			b, _ := os.ReadFile(filepath.Join(store.Path, e.Name()))
			if !codec.Sealed(b) || bytes.Contains(b, []byte("secret")) {
				t.Fatalf("stored blob %s is not sealed", e.Name())
			}
		}
	}
	if blobs != 1 {
		t.Fatalf("%d blobs, want 1", blobs)
	}
	var small, large string
	if err := dc.FromPayloads(ps, &small, &large); err != nil || small != "a small secret" || large != secret {
		t.Fatalf("read back: %v", err)
	}
}

// failingStore fails every call.
type failingStore struct{}

var errDown = errors.New("store down")

func (failingStore) Put(context.Context, []byte) (string, error) { return "", errDown }
func (failingStore) Get(context.Context, string) ([]byte, error) { return nil, errDown }

// A store that fails: a payload Temporal takes inline travels inline; a
// larger one is the store's error.
func TestAFailingStoreKeepsWhatFitsInline(t *testing.T) {
	dc := forWorkflow(claimcheck.DataConverter(failingStore{}, claimcheck.Options{Logger: quiet}), "action-1")
	p, err := dc.ToPayload(text(100 << 10))
	if err != nil || string(p.GetMetadata()[converter.MetadataEncoding]) == claimcheck.EncodingReference {
		t.Fatalf("100 KB: %v", err)
	}
	if _, err := dc.ToPayload(text(claimcheck.InlineLimit + 1)); !errors.Is(err, errDown) {
		t.Fatalf("over the inline limit: %v", err)
	}
}

// The codec server resolves references (after decrypting them) for the
// UI and CLI; its /encode leaves large payloads inline.
func TestTheCodecServerResolvesReferences(t *testing.T) {
	keys := codectest.Ring(t, codectest.Line(t, "k1"))
	store := dirStore(t)
	store.Keys = keys
	dc := forWorkflow(claimcheck.DataConverter(store, claimcheck.Options{Keys: keys, Logger: quiet}), "action-1")
	large := text(50 << 10)
	p, err := dc.ToPayload(large)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(codec.Handler(keys, codec.HandlerOptions{References: claimcheck.NewCodec(store, claimcheck.Options{}), MaxBodyBytes: 1 << 20}))
	defer srv.Close()
	post := func(path string, p *commonpb.Payload) *commonpb.Payload {
		t.Helper()
		body, _ := protojson.Marshal(&commonpb.Payloads{Payloads: []*commonpb.Payload{p}})
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		var out commonpb.Payloads
		if err := protojson.Unmarshal(b, &out); err != nil || len(out.GetPayloads()) != 1 {
			t.Fatalf("%s: %s %v", path, b, err)
		}
		return out.GetPayloads()[0]
	}
	decoded := post("/decode", p)
	var s string
	if err := converter.GetDefaultDataConverter().FromPayload(decoded, &s); err != nil || s != large {
		t.Fatalf("decoded %d bytes: %v", len(s), err)
	}
	plain, _ := converter.GetDefaultDataConverter().ToPayload(large)
	encoded := post("/encode", plain)
	if string(encoded.GetMetadata()[converter.MetadataEncoding]) != codec.EncodingEncrypted {
		t.Fatalf("encoded: %s", encoded.GetMetadata())
	}
	if back := post("/decode", encoded); !proto.Equal(back, plain) {
		t.Fatal("encode then decode changed the payload")
	}
}
