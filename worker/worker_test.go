package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
)

// The metrics address also served generated text (/v1/streams/), and the
// compose file bound it to 0.0.0.0 without a token: anyone on the network
// could read any action's answer by its id. The stream endpoint has its
// own address, and one beyond loopback needs a token.
func TestStreamEndpointBeyondLoopbackNeedsAToken(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"", "", true},
		{"127.0.0.1:9091", "", true},
		{"[::1]:9091", "", true},
		{"localhost:9091", "", true},
		{"0.0.0.0:9091", "", false},
		{":9091", "", false},
		{"10.1.2.3:9091", "", false},
		{"0.0.0.0:9091", "s3cret", true},
		{"not-an-address", "", false},
	} {
		err := checkStreamAddr(tc.addr, tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("addr %q token %v: err %v", tc.addr, tc.token != "", err)
		}
		if err != nil && tc.token == "" && strings.Contains(tc.addr, ":") && tc.addr != "not-an-address" && !strings.Contains(err.Error(), "token") {
			t.Errorf("the error does not say how to fix it: %v", err)
		}
	}
	// New refuses before it touches the Temporal client.
	if _, err := New(nil, Options{StreamAddr: "0.0.0.0:9091"}); err == nil || !strings.Contains(err.Error(), "stream token") {
		t.Fatalf("New: %v", err)
	}
}

// stuckJournal's writes block for good (until the test ends), as a
// journal stuck in the kernel does.
type stuckJournal struct{ hang chan struct{} }

func (j stuckJournal) Record(context.Context, journal.Entry) error { <-j.hang; return nil }
func (j stuckJournal) Lookup(context.Context, string) (journal.Entry, bool, error) {
	return journal.Entry{}, false, nil
}

// A worker whose journal writes it stopped waiting for have piled up to
// its cap says so on /readyz: it still runs attempts, but they go
// unjournaled until the journal comes back.
func TestReadyzSaysWhenTheJournalIsStuck(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	j := stuckJournal{hang: make(chan struct{})}
	defer close(j.hang)
	tel, err := telemetry.New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(nil, Options{
		Config:  routes.Config{Routes: []routes.Route{{Name: "p", Kind: routes.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m"}}},
		TLS:     p.ClientTLSConfig(),
		Journal: j, Telemetry: tel, Logger: slog.New(slog.DiscardHandler),
		MaxAbandonedJournalOps: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	readyz := func() (int, string) {
		rec := httptest.NewRecorder()
		tel.Handler(w.ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if _, body := readyz(); strings.Contains(body, "journal") {
		t.Fatalf("a fresh worker's /readyz speaks of the journal: %q", body)
	}
	for i := range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		in := attempt.Input{ActionRef: "act", Attempt: i + 1, AttemptID: fmt.Sprintf("act-%d", i), IdempotencyKey: "act", Route: "p",
			Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hello")}}}
		if _, err := w.acts.CallModel(ctx, in); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	code, body := readyz()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "journal") || !strings.Contains(body, "stuck") {
		t.Fatalf("/readyz with the journal stuck: %d %q", code, body)
	}
	if err := w.ready(context.Background()); !errors.Is(err, activities.ErrJournalStuck) {
		t.Fatalf("ready: %v", err)
	}
}
