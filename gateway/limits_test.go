package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A request whose body never finishes arriving holds one of its caller's
// max_in_flight places while it is read (a second request of the caller
// is refused), and the read is bounded: the gateway answers 408 once the
// body is late, and the place is free again.
func TestARequestBodyThatNeverArrivesTakesAPlaceAndIsDropped(t *testing.T) {
	g, err := New(Options{Client: unreachableClient(t), Models: ModelsFromRoutes([]string{"demo"}), Secret: bytes.Repeat([]byte("s"), 32),
		Tokens: NewTokens([]Caller{{ID: "a", Hash: sumOf("tok-a"), MaxInFlight: 1}}), Logger: slog.New(slog.DiscardHandler),
		// Long enough for the second request below to find the first still
		// reading its body on a busy machine.
		BodyTimeout: 5 * time.Second, StartTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	defer srv.Close()
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Ten of two hundred bytes, then nothing.
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-a\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"model\":")
	second := func() int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer tok-a")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// While the first body is read, the caller's one place is taken.
	deadline := time.Now().Add(10 * time.Second)
	for code := second(); code != http.StatusTooManyRequests; code = second() {
		if time.Now().After(deadline) {
			t.Fatalf("a second request got %d while the first body was still read: the place is taken only after the body", code)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the body that never came: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("X-Should-Retry") != "true" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if code := second(); code == http.StatusTooManyRequests {
		t.Fatal("the place of the dropped request was not freed")
	}
}
