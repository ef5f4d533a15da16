package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func withClock(s *Streams) *fakeClock {
	c := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s.now = c.now
	return c
}

// readAll reads a cursor to its end.
func readAll(t *testing.T, c *Cursor) []StreamEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []StreamEvent
	for {
		ev, err := c.Next(ctx)
		if errors.Is(err, ErrStreamEnded) {
			return out
		}
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, ev)
	}
}

func seqs(evs []StreamEvent) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return out
}

func TestStreamsNumberEachActionsEventsFromOne(t *testing.T) {
	s := NewStreams()
	a, b := s.forAttempt("a", 1), s.forAttempt("b", 2)
	a.Delta("1")
	b.Delta("x")
	a.Delta("2")
	b.Delta("y")
	a.Incomplete("reset")
	s.End("a", "completed_partial")
	s.End("b", "completed")

	all := readAll(t, s.Follow("a", 0))
	if got := fmt.Sprint(seqs(all)); got != "[1 2 3 4]" {
		t.Fatalf("a's sequence %s", got)
	}
	if all[0].Delta != "1" || all[1].Delta != "2" || all[2].Kind != EventIncomplete || all[3].Kind != EventEnd || all[3].End != "completed_partial" {
		t.Fatalf("a's events %+v", all)
	}
	if got := fmt.Sprint(seqs(readAll(t, s.Follow("b", 0)))); got != "[1 2 3]" {
		t.Fatalf("b's sequence %s", got)
	}
	// Resuming after sequence 2 gives what follows it.
	if got := fmt.Sprint(seqs(readAll(t, s.Follow("a", 2)))); got != "[3 4]" {
		t.Fatalf("after 2: %s", got)
	}
	// Past the end: nothing but the end.
	if got := readAll(t, s.Follow("a", 99)); len(got) != 0 {
		t.Fatalf("after 99: %+v", got)
	}
}

func TestStreamsChunkSinkPublishesTypedEvents(t *testing.T) {
	s := NewStreams()
	u := providers.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}
	sink := s.forAttempt("act", 3)
	sink.Chunk(exchange.Chunk{Text: "Hi"})
	sink.Chunk(exchange.Chunk{Refusal: "no", ToolCalls: []exchange.ToolCallDelta{{Index: 0, ID: "c1", Type: "function", Name: "f"}, {Index: 0, Arguments: "{}"}}})
	sink.Chunk(exchange.Chunk{FinishReason: "tool_calls", Usage: &u})
	s.attemptEnded("act", evidence.Completed)

	evs := readAll(t, s.Follow("act", 0))
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, string(e.Kind))
		if e.Kind != EventEnd && e.Attempt != 3 {
			t.Fatalf("event %+v: attempt %d, want 3", e, e.Attempt)
		}
	}
	if got := strings.Join(kinds, ","); got != "content,refusal,tool_call,tool_call,finish,usage,end" {
		t.Fatalf("kinds %s", got)
	}
	if evs[2].ToolCall.ID != "c1" || evs[3].ToolCall.Arguments != "{}" || evs[4].FinishReason != "tool_calls" || *evs[5].Usage != u || evs[6].End != "completed" {
		t.Fatalf("events %+v", evs)
	}
}

// An attempt's sink records the pieces of content the hub took, in order,
// so the response says how it streamed; nothing after the stream's end.
func TestAnAttemptsSinkRecordsThePiecesItPublished(t *testing.T) {
	s := NewStreams()
	sink := s.forAttempt("act", 1)
	sink.Chunk(exchange.Chunk{Text: "Hé"})
	sink.Chunk(exchange.Chunk{Refusal: "no", ToolCalls: []exchange.ToolCallDelta{{Index: 0, ID: "c1", Type: "function", Name: "f"}, {Index: 0, Arguments: "{}"}}})
	sink.Chunk(exchange.Chunk{FinishReason: "stop"})
	sink.Delta("!")
	if sink.pieces != "t3 r2 c0:iyn:0 c0::2 t1" {
		t.Fatalf("pieces %q", sink.pieces)
	}
	s.End("act", "completed")
	sink.Delta("late")
	if sink.pieces != "t3 r2 c0:iyn:0 c0::2 t1" {
		t.Fatalf("a piece the hub refused was recorded: %q", sink.pieces)
	}
}

// Only a class that ends the action whatever the workflow decides ends
// the stream: a retry or a fallback may still stream, here or elsewhere.
func TestStreamsAttemptEndedEndsOnlyOnFinalClasses(t *testing.T) {
	for _, tc := range []struct {
		class evidence.Class
		ends  bool
	}{
		{evidence.Completed, true},
		{evidence.CommittedPartial, true},
		{evidence.Canceled, true},
		{evidence.Rejected, true},
		{evidence.ContentFiltered, true},
		{evidence.Unsent, false},
		{evidence.Refused, false},
		{evidence.Throttled, false},
		{evidence.UpstreamError, false},
		{evidence.EmptyResponse, false},
		{evidence.IncompatibleRoute, false},
		{evidence.Misdirected, false},
		{evidence.Ambiguous, false},
	} {
		t.Run(string(tc.class), func(t *testing.T) {
			s := NewStreams()
			s.attemptEnded("act", tc.class)
			ev, ok, _, _ := s.Follow("act", 0).Poll()
			if ended := ok && ev.Kind == EventEnd; ended != tc.ends {
				t.Fatalf("ended %v, want %v", ended, tc.ends)
			}
		})
	}
}

func TestStreamsNothingIsAppendedAfterTheEnd(t *testing.T) {
	s := NewStreams()
	s.End("act", "failed")
	s.forAttempt("act", 1).Delta("late")
	s.End("act", "completed")
	evs := readAll(t, s.Follow("act", 0))
	if len(evs) != 1 || evs[0].End != "failed" {
		t.Fatalf("events %+v", evs)
	}
}

func TestStreamsFollowerWaitsForLiveEventsAndClose(t *testing.T) {
	s := NewStreams()
	c := s.Follow("act", 0)
	got := make(chan StreamEvent)
	go func() {
		ev, err := c.Next(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- ev
	}()
	s.forAttempt("act", 1).Delta("live")
	if ev := <-got; ev.Delta != "live" || ev.Seq != 1 {
		t.Fatalf("%+v", ev)
	}
	errc := make(chan error)
	go func() {
		_, err := c.Next(context.Background())
		errc <- err
	}()
	c.Close()
	if err := <-errc; !errors.Is(err, ErrStreamClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	c.Close() // twice is fine
}

func TestStreamsKeepAnEndedLogForItsRetention(t *testing.T) {
	s := NewStreams()
	clk := withClock(s)
	s.forAttempt("act", 1).Delta("kept")
	s.End("act", "completed")

	clk.add(DefaultStreamRetention - time.Second)
	if evs := readAll(t, s.Follow("act", 0)); len(evs) != 2 || evs[0].Delta != "kept" || evs[1].Kind != EventEnd {
		t.Fatalf("within the retention: %+v", evs)
	}
	clk.add(2 * time.Second)
	// The next use sweeps; the action's log is gone, so a new follower
	// waits on a fresh, empty log.
	_, ok, _, err := s.Follow("act", 0).Poll()
	if ok || err != nil {
		t.Fatalf("after the retention: ok %v err %v, want an empty live log", ok, err)
	}
}

// A log that never ended (its last attempt went to another worker) goes
// once idle for the retention with nobody following it.
func TestStreamsDropAnIdleUnendedLog(t *testing.T) {
	s := NewStreams()
	clk := withClock(s)
	s.forAttempt("act", 1).Delta("x")
	followed := s.Follow("other", 0)
	clk.add(DefaultStreamRetention + time.Second)
	s.forAttempt("third", 1).Delta("sweeps")
	s.mu.Lock()
	_, kept := s.logs["act"]
	_, other := s.logs["other"]
	s.mu.Unlock()
	if kept || !other {
		t.Fatalf("idle log kept %v, followed log kept %v", kept, other)
	}
	followed.Close()
}

func TestStreamsBoundDropsTheOldestEndedLogsFirst(t *testing.T) {
	s := NewStreams()
	s.MaxBytes = 3 * (eventOverhead + 100)
	clk := withClock(s)
	big := strings.Repeat("x", 100)
	running := s.forAttempt("running", 1)
	running.Delta(big)
	for _, ref := range []string{"old", "mid", "new"} {
		s.forAttempt(ref, 1).Delta(big)
		s.End(ref, "completed")
		clk.add(time.Second)
	}
	s.mu.Lock()
	var left []string
	for _, ref := range []string{"running", "old", "mid", "new"} {
		if _, ok := s.logs[ref]; ok {
			left = append(left, ref)
		}
	}
	s.mu.Unlock()
	if got := strings.Join(left, ","); got != "running,mid,new" {
		t.Fatalf("logs left %s", got)
	}
}

// The typed stream replays the log after starting_after, goes live, and
// ends after the end event, ids being the action's sequence numbers.
func TestStreamHandlerStartingAfterReplaysThenGoesLive(t *testing.T) {
	s := NewStreams()
	h := s.StreamHandler(StreamHandlerOptions{KeepAlive: time.Hour})
	protocols(t, h, func(t *testing.T, base string, c *http.Client) {
		ref := "act-" + strings.ReplaceAll(t.Name(), "/", "-")
		sink := s.forAttempt(ref, 1)
		sink.Delta("one")
		sink.Delta("two")
		ctx := testCtx(t)
		_, r := openStream(ctx, t, c, base+"/v1/streams/"+ref+"?starting_after=1")
		m, err := r.next()
		if err != nil || m.ID != "2" || m.Event != "content" {
			t.Fatalf("first event %+v %v", m, err)
		}
		var ev StreamEvent
		if err := json.Unmarshal([]byte(m.Data), &ev); err != nil || ev.Delta != "two" || ev.Seq != 2 || ev.ActionRef != "" {
			t.Fatalf("data %s: %+v %v", m.Data, ev, err)
		}
		sink.Chunk(exchange.Chunk{Refusal: "live"})
		s.attemptEnded(ref, evidence.Completed)
		for _, want := range []sseMsg{{ID: "3", Event: "refusal"}, {ID: "4", Event: "end"}} {
			m, err := r.next()
			if err != nil || m.ID != want.ID || m.Event != want.Event {
				t.Fatalf("got %+v %v, want %+v", m, err, want)
			}
		}
		if m, err := r.next(); !errors.Is(err, io.EOF) {
			t.Fatalf("after the end: %+v %v", m, err)
		}
	})
}

func TestStreamHandlerStartingAfterMustBeANumber(t *testing.T) {
	s := NewStreams()
	srv := s.StreamHandler(StreamHandlerOptions{})
	for _, v := range []string{"", "-1", "x", "1.5"} {
		req, _ := http.NewRequest(http.MethodGet, "/v1/streams/act?starting_after="+v, nil)
		rec := newRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("starting_after=%q: status %d, want 400", v, rec.Code)
		}
	}
}

// The per-connection format ends at the end event, sending it.
func TestStreamHandlerEndEventEndsTheStream(t *testing.T) {
	s := NewStreams()
	srv := newServer(t, s.StreamHandler(StreamHandlerOptions{KeepAlive: time.Hour}))
	ctx := testCtx(t)
	_, r := openStream(ctx, t, srv.Client(), srv.URL+"/v1/streams/act")
	s.forAttempt("act", 1).Chunk(exchange.Chunk{Text: "a", FinishReason: "stop"})
	s.attemptEnded("act", evidence.Completed)
	want := []sseMsg{
		{ID: "1", Event: "delta", Data: `{"attempt":1,"delta":"a"}`},
		{ID: "2", Event: "end", Data: `{"end":"completed"}`},
	}
	for i, w := range want {
		m, err := r.next()
		if err != nil || m != w {
			t.Fatalf("event %d: %+v %v, want %+v", i, m, err, w)
		}
	}
	if m, err := r.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the end: %+v %v", m, err)
	}
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}
