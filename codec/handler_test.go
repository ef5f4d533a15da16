package codec

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/encoding/protojson"
)

const (
	testToken  = "s3cret-codec-token"
	testOrigin = "http://localhost:8233"
)

// payloadsJSON is the request body the UI and CLI send: protobuf JSON of a
// Payloads message.
func payloadsJSON(t *testing.T, ps []*commonpb.Payload) []byte {
	t.Helper()
	b, err := protojson.Marshal(&commonpb.Payloads{Payloads: ps})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// codecRequest builds a POST with the headers a well-behaved caller sends.
func codecRequest(t *testing.T, path string, body []byte) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Namespace", "default")
	r.Header.Set("Authorization", "Bearer "+testToken)
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func testHandler(t *testing.T, opts HandlerOptions) (http.Handler, *Keyring) {
	t.Helper()
	_, k1 := newKey(t)
	k := mustKeyring(t, "k1:"+k1)
	return Handler(k, opts), k
}

// TestHandlerRoundTripWithSDKClient drives the server with the SDK's own
// remote codec client, which is what the temporal CLI uses.
func TestHandlerRoundTripWithSDKClient(t *testing.T) {
	h, k := testHandler(t, HandlerOptions{
		AuthToken:         testToken,
		AllowedNamespaces: []string{"default"},
	})
	srv := httptest.NewServer(h)
	defer srv.Close()

	remote := converter.NewRemotePayloadCodec(converter.RemotePayloadCodecOptions{
		Endpoint: srv.URL,
		ModifyRequest: func(r *http.Request) error {
			r.Header.Set("X-Namespace", "default")
			r.Header.Set("Authorization", "Bearer "+testToken)
			return nil
		},
	})
	orig := samplePayloads(t)
	enc, err := remote.Encode(orig)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range enc {
		if string(p.GetMetadata()[converter.MetadataEncoding]) != EncodingEncrypted {
			t.Fatalf("remote payload %d not encrypted: %q", i, p.GetMetadata())
		}
	}
	// What the server encrypted, a worker holding the keys can read.
	local, err := NewCodec(k).Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	assertSamePayloads(t, local, orig)

	dec, err := remote.Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	assertSamePayloads(t, dec, orig)

	// The remote data converter (tctl-style) sees plain values.
	dc := converter.NewRemoteDataConverter(converter.GetDefaultDataConverter(), converter.RemoteDataConverterOptions{
		Endpoint: srv.URL + "/",
		ModifyRequest: func(r *http.Request) error {
			r.Header.Set("X-Namespace", "default")
			r.Header.Set("Authorization", "Bearer "+testToken)
			return nil
		},
	})
	p, err := DataConverter(k).ToPayload(prompt{Model: "m", Messages: []string{canary}})
	if err != nil {
		t.Fatal(err)
	}
	var got prompt
	if err := dc.FromPayload(p, &got); err != nil || got.Messages[0] != canary {
		t.Fatalf("remote FromPayload = %+v, %v", got, err)
	}
}

func TestHandlerJSONProtocol(t *testing.T) {
	h, _ := testHandler(t, HandlerOptions{AuthToken: testToken})
	orig := samplePayloads(t)

	// Mounted under a prefix, as the protocol allows, with the query the UI adds.
	w := serve(h, codecRequest(t, "/codec/ns/encode", payloadsJSON(t, orig)))
	if w.Code != http.StatusOK {
		t.Fatalf("encode status %d: %s", w.Code, w.Body)
	}
	if cc := w.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", cc)
	}
	if bytes.Contains(w.Body.Bytes(), []byte(canary)) {
		t.Fatal("encode response contains the plaintext")
	}
	var enc commonpb.Payloads
	if err := protojson.Unmarshal(w.Body.Bytes(), &enc); err != nil {
		t.Fatalf("encode response is not Payloads JSON: %v", err)
	}

	w = serve(h, codecRequest(t, "/codec/ns/decode?preserveStorageRefs=true", payloadsJSON(t, enc.Payloads)))
	if w.Code != http.StatusOK {
		t.Fatalf("decode status %d: %s", w.Code, w.Body)
	}
	var dec commonpb.Payloads
	if err := protojson.Unmarshal(w.Body.Bytes(), &dec); err != nil {
		t.Fatal(err)
	}
	assertSamePayloads(t, dec.Payloads, orig)

	// A payload that fails authentication: 400 naming the key, not the data.
	enc.Payloads[0].Data[nonceSize] ^= 1
	w = serve(h, codecRequest(t, "/decode", payloadsJSON(t, enc.Payloads)))
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"k1"`) {
		t.Fatalf("tampered decode = %d %q, want 400 naming k1", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), canary) {
		t.Fatal("error response contains plaintext")
	}
}

func TestHandlerAuth(t *testing.T) {
	h, _ := testHandler(t, HandlerOptions{AuthToken: testToken})
	body := payloadsJSON(t, samplePayloads(t))
	cases := []struct {
		name   string
		header string // "" removes the header
		want   int
	}{
		{"no Authorization", "", http.StatusUnauthorized},
		{"wrong token", "Bearer nope", http.StatusUnauthorized},
		{"token prefix only", "Bearer " + testToken[:5], http.StatusUnauthorized},
		{"token with suffix", "Bearer " + testToken + "x", http.StatusUnauthorized},
		{"other scheme", "Basic " + testToken, http.StatusUnauthorized},
		{"bare token", testToken, http.StatusUnauthorized},
		{"right token", "Bearer " + testToken, http.StatusOK},
		{"scheme is case-insensitive", "bearer " + testToken, http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := codecRequest(t, "/encode", body)
			if tc.header == "" {
				r.Header.Del("Authorization")
			} else {
				r.Header.Set("Authorization", tc.header)
			}
			w := serve(h, r)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			if tc.want == http.StatusUnauthorized {
				if w.Header().Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
				if strings.Contains(w.Body.String(), testToken) {
					t.Error("401 body echoes the token")
				}
			}
		})
	}
}

func TestHandlerCORS(t *testing.T) {
	h, _ := testHandler(t, HandlerOptions{
		AuthToken:      testToken,
		AllowedOrigins: []string{testOrigin + "/", "https://ui.example.com"},
	})

	t.Run("preflight from the UI", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodOptions, "/decode", nil)
		r.Header.Set("Origin", testOrigin)
		r.Header.Set("Access-Control-Request-Method", "POST")
		r.Header.Set("Access-Control-Request-Headers", "content-type,x-namespace,authorization")
		w := serve(h, r) // no token: browsers never send one on a preflight
		if w.Code != http.StatusNoContent {
			t.Fatalf("status %d, want 204", w.Code)
		}
		hdr := w.Header()
		if got := hdr.Get("Access-Control-Allow-Origin"); got != testOrigin {
			t.Errorf("Allow-Origin = %q", got)
		}
		if got := hdr.Get("Access-Control-Allow-Credentials"); got != "true" {
			t.Errorf("Allow-Credentials = %q", got)
		}
		if got := hdr.Get("Access-Control-Allow-Methods"); !strings.Contains(got, "POST") {
			t.Errorf("Allow-Methods = %q", got)
		}
		allowed := strings.ToLower(hdr.Get("Access-Control-Allow-Headers"))
		for _, want := range []string{"content-type", "x-namespace", "authorization"} {
			if !strings.Contains(allowed, want) {
				t.Errorf("Allow-Headers %q lacks %s", allowed, want)
			}
		}
		if !strings.Contains(hdr.Get("Vary"), "Origin") {
			t.Errorf("Vary = %q, want Origin", hdr.Get("Vary"))
		}
	})

	t.Run("preflight from another origin", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodOptions, "/decode", nil)
		r.Header.Set("Origin", "https://evil.example.net")
		r.Header.Set("Access-Control-Request-Method", "POST")
		w := serve(h, r)
		if w.Code != http.StatusForbidden || w.Header().Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("status %d Allow-Origin %q, want 403 and none", w.Code, w.Header().Get("Access-Control-Allow-Origin"))
		}
	})

	t.Run("request from the UI carries CORS headers", func(t *testing.T) {
		r := codecRequest(t, "/encode", payloadsJSON(t, samplePayloads(t)))
		r.Header.Set("Origin", "https://UI.example.com")
		w := serve(h, r)
		if w.Code != http.StatusOK || w.Header().Get("Access-Control-Allow-Origin") != "https://UI.example.com" {
			t.Fatalf("status %d Allow-Origin %q", w.Code, w.Header().Get("Access-Control-Allow-Origin"))
		}
	})

	t.Run("simple request from another origin is refused", func(t *testing.T) {
		r := codecRequest(t, "/decode", payloadsJSON(t, nil))
		r.Header.Set("Origin", "https://evil.example.net")
		r.Header.Set("Content-Type", "text/plain")
		if w := serve(h, r); w.Code != http.StatusForbidden {
			t.Fatalf("status %d, want 403", w.Code)
		}
	})

	t.Run("no origins configured means no CORS", func(t *testing.T) {
		h, _ := testHandler(t, HandlerOptions{})
		r := httptest.NewRequest(http.MethodOptions, "/decode", nil)
		r.Header.Set("Origin", testOrigin)
		r.Header.Set("Access-Control-Request-Method", "POST")
		w := serve(h, r)
		if w.Header().Get("Access-Control-Allow-Origin") != "" || w.Code != http.StatusForbidden {
			t.Fatalf("status %d Allow-Origin %q, want 403 and none", w.Code, w.Header().Get("Access-Control-Allow-Origin"))
		}
	})
}

// chunked hides the body's length, as a streaming client would.
type chunked struct{ io.Reader }

func TestHandlerBodyLimit(t *testing.T) {
	t.Run("default 4 MiB", func(t *testing.T) {
		h, _ := testHandler(t, HandlerOptions{})
		big := bytes.Repeat([]byte(" "), DefaultMaxBodyBytes+1)
		w := serve(h, codecRequest(t, "/encode", big))
		if w.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413", w.Code)
		}
	})
	h, _ := testHandler(t, HandlerOptions{MaxBodyBytes: 1024})
	t.Run("declared length above the limit", func(t *testing.T) {
		w := serve(h, codecRequest(t, "/encode", bytes.Repeat([]byte(" "), 1025)))
		if w.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413", w.Code)
		}
	})
	t.Run("unknown length above the limit", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodPost, "/decode", chunked{bytes.NewReader(bytes.Repeat([]byte(" "), 4096))})
		if r.ContentLength != -1 {
			t.Fatalf("test setup: ContentLength = %d", r.ContentLength)
		}
		if w := serve(h, r); w.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413", w.Code)
		}
	})
	t.Run("at the limit is fine", func(t *testing.T) {
		body := payloadsJSON(t, nil)
		body = append(body, bytes.Repeat([]byte(" "), 1024-len(body))...)
		if w := serve(h, codecRequest(t, "/encode", body)); w.Code != http.StatusOK {
			t.Fatalf("status %d, want 200: %s", w.Code, w.Body)
		}
	})
}

func TestHandlerNamespaces(t *testing.T) {
	h, _ := testHandler(t, HandlerOptions{AllowedNamespaces: []string{"default", "llm-prod"}})
	body := payloadsJSON(t, samplePayloads(t))
	for _, tc := range []struct {
		ns   string
		want int
	}{
		{"default", http.StatusOK},
		{"llm-prod", http.StatusOK},
		{"payments", http.StatusForbidden},
		{"", http.StatusForbidden},
	} {
		r := codecRequest(t, "/decode", body)
		if tc.ns == "" {
			r.Header.Del("X-Namespace")
		} else {
			r.Header.Set("X-Namespace", tc.ns)
		}
		if w := serve(h, r); w.Code != tc.want {
			t.Errorf("namespace %q: status %d, want %d", tc.ns, w.Code, tc.want)
		}
	}
}

func TestHandlerRoutes(t *testing.T) {
	h, _ := testHandler(t, HandlerOptions{AuthToken: testToken})
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/healthz", http.StatusOK}, // no token needed
		{http.MethodHead, "/healthz", http.StatusOK},
		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed},
		{http.MethodGet, "/decode", http.StatusMethodNotAllowed},
		{http.MethodPost, "/other", http.StatusNotFound},
		{http.MethodPost, "/", http.StatusNotFound},
	} {
		r := httptest.NewRequest(tc.method, tc.path, strings.NewReader("{}"))
		r.Header.Set("Authorization", "Bearer "+testToken)
		if tc.path == "/healthz" {
			r.Header.Del("Authorization")
		}
		if w := serve(h, r); w.Code != tc.want {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, w.Code, tc.want)
		}
	}

	// Malformed JSON is the SDK handler's 400, not a crash.
	if w := serve(h, codecRequest(t, "/decode", []byte("{not json"))); w.Code != http.StatusBadRequest {
		t.Errorf("bad JSON: status %d, want 400", w.Code)
	}
}

// TestHandlerOverRealServer checks the limit and the 401 through a real
// HTTP stack, where the body is streamed.
func TestHandlerOverRealServer(t *testing.T) {
	h, _ := testHandler(t, HandlerOptions{AuthToken: testToken, MaxBodyBytes: 2048})
	srv := httptest.NewServer(h)
	defer srv.Close()

	post := func(auth string, body io.Reader) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/decode", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if got := post("", strings.NewReader(`{"payloads":[]}`)); got != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", got)
	}
	if got := post("Bearer "+testToken, chunked{strings.NewReader(strings.Repeat(" ", 10_000))}); got != http.StatusRequestEntityTooLarge {
		t.Errorf("big chunked body: %d, want 413", got)
	}
	if got := post("Bearer "+testToken, strings.NewReader(`{"payloads":[]}`)); got != http.StatusOK {
		t.Errorf("good request: %d, want 200", got)
	}

	// The SDK client surfaces the server's refusal as an error.
	remote := converter.NewRemotePayloadCodec(converter.RemotePayloadCodecOptions{Endpoint: srv.URL})
	if _, err := remote.Decode(samplePayloads(t)); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("remote without token: %v", err)
	}
}
