package recovery_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// slowConn makes every write to the socket take a while, so a header block
// of several frames is still being written when a short deadline fires.
type slowConn struct {
	net.Conn
	delay time.Duration
}

func (c *slowConn) Write(b []byte) (int, error) {
	time.Sleep(c.delay)
	return c.Conn.Write(b)
}

// A context that ends while x/net is writing an attempt's HEADERS: x/net's
// RoundTrip returns at once, but the header block it had begun is still
// written to the connection. Whatever the evidence says, it must never
// claim "never sent" for a request the server received.
//
// Each attempt carries a header of about 40 KB, so its block is a HEADERS
// frame and two CONTINUATIONs, written with a pause per socket write; the
// deadlines are spread over the time that takes, so some attempts end
// before, some during and some after the block is written. The server
// records every request whose header block it decoded.
func TestContextEndingWhileWritingHeadersRecordedUnsent(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	p.SetDefault(providertest.Hold())
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &slowConn{Conn: c, delay: 2 * time.Millisecond}, nil
	}
	e := recovery.New(recovery.Config{AllowH2C: true, DialContext: dial, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() {
		e.Close()
		p.Close()
	})
	pad := strings.Repeat("0123456789abcdef", 4<<10) // 64 KiB, about 40 KB once hpack-encoded

	type sent struct {
		id string
		ev evidence.Evidence
		c  evidence.Classification
	}
	var attempts []sent
	const n = 100
	stop := time.Now().Add(4 * time.Second) // bounds the run, not an assertion
	for i := 0; i < n && time.Now().Before(stop); i++ {
		a := recovery.NewAttempt(recovery.Spec{IdempotencyKey: "race"})
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(500+(i%12)*500)*time.Microsecond)
		req, err := http.NewRequestWithContext(recovery.WithAttempt(ctx, a), http.MethodPost, p.H2CURL()+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Padding", pad)
		if resp, err := e.RoundTrip(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		cancel()
		ev, c := a.Finish(evidence.SignalNone)
		attempts = append(attempts, sent{a.ID(), ev, c})
	}
	// Every header block x/net began is written whole, and in order: once
	// a later request has been answered on the same connection, the
	// server's record holds every block of the loop.
	p.SetDefault(providertest.Answer("ok"))
	a := recovery.NewAttempt(recovery.Spec{IdempotencyKey: "fence"})
	req, _ := http.NewRequestWithContext(recovery.WithAttempt(t.Context(), a), http.MethodPost, p.H2CURL()+"/v1/chat/completions", strings.NewReader(`{}`))
	resp, err := e.RoundTrip(req)
	if err != nil {
		t.Fatalf("fence request: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if _, c := a.Finish(evidence.SignalNone); c.Class != evidence.Completed || len(e.Stats().GoAways) != 0 {
		t.Fatalf("fence request %s (%s); the loop's connection must still be the one in use", c.Class, c.Reason)
	}

	received := map[string]bool{}
	for _, r := range p.Received() {
		received[r.AttemptID] = true
	}
	var arrived, wrong, unsent, maybe int
	for _, s := range attempts {
		if s.c.Class == evidence.Unsent {
			unsent++
		}
		if s.ev.MaybeSent {
			maybe++
		}
		if !received[s.id] {
			continue
		}
		arrived++
		if !(s.ev.RequestSent || s.ev.MaybeSent) || s.c.Class == evidence.Unsent {
			wrong++
			if wrong <= 3 {
				t.Errorf("attempt %s reached the server but: request_sent=%v maybe_sent=%v, classified %s (%s)", s.id, s.ev.RequestSent, s.ev.MaybeSent, s.c.Class, s.c.Reason)
			}
		}
	}
	t.Logf("%d attempts: %d reached the server, %d classified unsent, %d maybe sent, %d reached it while recorded unsent", len(attempts), arrived, unsent, maybe, wrong)
	if wrong > 0 {
		t.Fatalf("%d of %d attempts reached the server while recorded as never sent", wrong, len(attempts))
	}
	if arrived == 0 || unsent == 0 {
		// Without both kinds the deadlines no longer straddle the header
		// write, and the loop above proved nothing.
		t.Fatalf("%d reached the server, %d unsent: the scenario did not happen", arrived, unsent)
	}
}
