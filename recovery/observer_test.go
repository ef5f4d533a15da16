package recovery

import (
	"bytes"
	"math/rand/v2"
	"net"
	"strings"
	"testing"

	"github.com/durallm/durallm/evidence"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientBytes builds what an HTTP/2 client writes: the preface, SETTINGS,
// and one request per attempt id on streams 1, 3, 5, ... with an hpack
// encoder whose dynamic table carries across requests (as x/net's does).
func clientBytes(t testing.TB, ids []string, split bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString(clientPreface)
	fr := http2.NewFramer(&buf, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i, id := range ids {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
			{Name: ":authority", Value: "api.example"}, {Name: ":path", Value: "/v1/chat/completions"},
			{Name: "authorization", Value: "Bearer sk-secret", Sensitive: true},
			{Name: strings.ToLower(HeaderAttemptID), Value: id},
			{Name: "content-type", Value: "application/json"},
		} {
			if err := enc.WriteField(f); err != nil {
				t.Fatal(err)
			}
		}
		stream := uint32(2*i + 1)
		block := hb.Bytes()
		if split && len(block) > 4 {
			// HEADERS with padding and priority, then a CONTINUATION.
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: block[:4], PadLength: 3, Priority: http2.PriorityParam{Weight: 15}}); err != nil {
				t.Fatal(err)
			}
			if err := fr.WriteContinuation(stream, true, block[4:]); err != nil {
				t.Fatal(err)
			}
		} else if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: block, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteData(stream, true, []byte(`{"model":"m"}`)); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// sink is a net.Conn that swallows writes and serves reads from a buffer.
type sink struct {
	net.Conn
	r *bytes.Reader
}

func (s *sink) Write(b []byte) (int, error) { return len(b), nil }
func (s *sink) Read(b []byte) (int, error)  { return s.r.Read(b) }
func (s *sink) Close() error                { return nil }

func TestObserverMapsAttemptsToStreamsAcrossArbitrarySplits(t *testing.T) {
	ids := []string{"a1", "a2", "a3", "a4", "a5", "a6"}
	for _, split := range []bool{false, true} {
		wire := clientBytes(t, ids, split)
		for seed := uint64(0); seed < 50; seed++ {
			o := NewObserver()
			for _, id := range ids {
				o.Track(id)
			}
			oc, _ := o.wrap(&sink{}, "p-c1", ConnHooks{})
			rng := rand.New(rand.NewPCG(seed, 7))
			for rest := wire; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(40))
				if _, err := oc.Write(rest[:n]); err != nil {
					t.Fatal(err)
				}
				rest = rest[n:]
			}
			for i, id := range ids {
				f := o.Stream(id, nil)
				if f.MappingLost || f.StreamID != uint32(2*i+1) || f.Streams != 1 || f.ConnRef != "p-c1" || f.RequestBytes == 0 {
					t.Fatalf("split=%v seed=%d attempt %s: %+v, want stream %d", split, seed, id, f, 2*i+1)
				}
			}
		}
	}
}

func TestObserverCountsAReplayOnAnotherConnection(t *testing.T) {
	o := NewObserver()
	o.Track("dup")
	for _, ref := range []string{"p-c1", "p-c2"} {
		oc, _ := o.wrap(&sink{}, ref, ConnHooks{})
		if _, err := oc.Write(clientBytes(t, []string{"dup"}, false)); err != nil {
			t.Fatal(err)
		}
	}
	f := o.Stream("dup", nil)
	if f.Streams != 2 || f.ConnRef != "p-c2" {
		t.Fatalf("replay not seen: %+v", f)
	}
}

func TestObserverReadsServerFrames(t *testing.T) {
	var in bytes.Buffer
	fr := http2.NewFramer(&in, nil)
	_ = fr.WriteSettings()
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x88}, EndHeaders: true})
	_ = fr.WriteRSTStream(3, http2.ErrCodeRefusedStream)
	_ = fr.WriteGoAway(3, http2.ErrCodeEnhanceYourCalm, []byte("secret debug data"))

	o := NewObserver()
	o.Track("a1")
	o.Track("a2")
	var hooked []evidence.GoAway
	oc, _ := o.wrap(&sink{r: bytes.NewReader(in.Bytes())}, "p-c1", ConnHooks{GoAway: func(g evidence.GoAway) { hooked = append(hooked, g) }})
	if _, err := oc.Write(clientBytes(t, []string{"a1", "a2"}, false)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	for {
		if _, err := oc.Read(buf); err != nil {
			break
		}
	}
	a1, a2 := o.Stream("a1", nil), o.Stream("a2", nil)
	if !a1.ResponseHeaders || a1.RSTStream != nil {
		t.Errorf("a1: %+v", a1)
	}
	if a2.RSTStream == nil || *a2.RSTStream != evidence.CodeRefusedStream {
		t.Errorf("a2 RST: %+v", a2)
	}
	want := evidence.GoAway{LastStreamID: 3, Code: evidence.CodeEnhanceYourCalm, DebugLen: len("secret debug data")}
	if a2.GoAway == nil || *a2.GoAway != want || len(hooked) != 1 || hooked[0] != want {
		t.Errorf("GOAWAY: facts %+v hooked %+v, want %+v", a2.GoAway, hooked, want)
	}
	if !a2.ConnClosed {
		t.Error("EOF on read did not mark the connection closed")
	}
}

func TestObserverLosesMappingOnGarbage(t *testing.T) {
	lost := 0
	o := NewObserver()
	o.Track("a1")
	oc, _ := o.wrap(&sink{}, "p-c1", ConnHooks{Lost: func() { lost++ }})
	if _, err := oc.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if f := o.Stream("a1", oc); !f.MappingLost || lost != 1 {
		t.Fatalf("garbage preface: %+v lost=%d", f, lost)
	}
}

func TestObserverBoundsHeaderBlocks(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString(clientPreface)
	fr := http2.NewFramer(&buf, nil)
	chunk := make([]byte, 16384)
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: chunk})
	for i := 0; i < maxHeaderBlock/len(chunk)+1; i++ {
		_ = fr.WriteContinuation(1, false, chunk)
	}
	o := NewObserver()
	oc, _ := o.wrap(&sink{}, "p-c1", ConnHooks{})
	_, _ = oc.Write(buf.Bytes())
	if !oc.lost {
		t.Fatal("an endless header block must lose the mapping, not grow memory")
	}
}

// FuzzObserver feeds arbitrary bytes in both directions: the observer must
// never panic, never hold more than its bounds, and a connection it cannot
// follow must say so.
func FuzzObserver(f *testing.F) {
	f.Add(clientBytes(f, []string{"a1", "a2"}, true), []byte{0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Add([]byte(clientPreface), []byte{})
	f.Add([]byte(clientPreface+"\x00\x00\x01\x01\x05\x00\x00\x00\x01\xff"), []byte{0, 0, 4, 3, 0, 0, 0, 0, 1, 0, 0, 0, 7})
	f.Fuzz(func(t *testing.T, out, in []byte) {
		o := NewObserver()
		o.Track("a1")
		oc, _ := o.wrap(&sink{r: bytes.NewReader(in)}, "p-c1", ConnHooks{})
		for len(out) > 0 {
			n := min(len(out), 1+int(out[0])%64)
			_, _ = oc.Write(out[:n])
			out = out[n:]
		}
		buf := make([]byte, 7)
		for {
			if _, err := oc.Read(buf); err != nil {
				break
			}
		}
		_ = o.Stream("a1", oc)
		if len(oc.block) > maxHeaderBlock {
			t.Fatalf("header block grew to %d", len(oc.block))
		}
	})
}

// TestTwoGoAwaysForgetTheFirstCodeObserver feeds the observer GOAWAY pairs
// in both orders: the facts keep the lowest last-stream id and the first
// non-NO_ERROR code (as x/net's ClientConn does), whatever came last.
func TestTwoGoAwaysForgetTheFirstCodeObserver(t *testing.T) {
	type frame struct {
		last uint32
		code http2.ErrCode
	}
	tests := []struct {
		name   string
		frames []frame
		want   evidence.GoAway
	}{
		{"calm then graceful", []frame{{5, http2.ErrCodeEnhanceYourCalm}, {5, http2.ErrCodeNo}}, evidence.GoAway{LastStreamID: 5, Code: evidence.CodeEnhanceYourCalm, DebugLen: 1}},
		{"graceful at max then the real boundary", []frame{{1<<31 - 1, http2.ErrCodeNo}, {3, http2.ErrCodeNo}}, evidence.GoAway{LastStreamID: 3, Code: evidence.CodeNoError, DebugLen: 2}},
		{"a higher id never raises the boundary", []frame{{3, http2.ErrCodeNo}, {7, http2.ErrCodeNo}}, evidence.GoAway{LastStreamID: 3, Code: evidence.CodeNoError, DebugLen: 2}},
		{"graceful then calm", []frame{{7, http2.ErrCodeNo}, {3, http2.ErrCodeEnhanceYourCalm}}, evidence.GoAway{LastStreamID: 3, Code: evidence.CodeEnhanceYourCalm, DebugLen: 2}},
		{"the first error code stays", []frame{{7, http2.ErrCodeEnhanceYourCalm}, {5, http2.ErrCodeProtocol}, {5, http2.ErrCodeNo}}, evidence.GoAway{LastStreamID: 5, Code: evidence.CodeEnhanceYourCalm, DebugLen: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in bytes.Buffer
			fr := http2.NewFramer(&in, nil)
			for i, f := range tt.frames {
				// Debug data of a different length per frame shows which
				// frame the kept code came from.
				_ = fr.WriteGoAway(f.last, f.code, bytes.Repeat([]byte("d"), i+1))
			}
			o := NewObserver()
			var hooked []evidence.ErrCode
			oc, _ := o.wrap(&sink{r: bytes.NewReader(in.Bytes())}, "p-c1", ConnHooks{GoAway: func(g evidence.GoAway) { hooked = append(hooked, g.Code) }})
			buf := make([]byte, 64)
			for {
				if _, err := oc.Read(buf); err != nil {
					break
				}
			}
			if f := o.Stream("none", oc); f.GoAway == nil || *f.GoAway != tt.want {
				t.Fatalf("GOAWAY facts %+v, want %+v", f.GoAway, tt.want)
			}
			if len(hooked) != len(tt.frames) || hooked[len(hooked)-1] != evidence.ErrCode(tt.frames[len(tt.frames)-1].code) {
				t.Fatalf("hook saw %v: every frame must reach it with its own code", hooked)
			}
		})
	}
}

// TestUntrackRacingBindLeavesNoEntry plays both orders of a bind racing
// Untrack: bind looks the tracker up (under the connection's lock) and
// attaches it; Untrack may run entirely between the two. Either way the
// connection's stream map must end up without the attempt.
func TestUntrackRacingBindLeavesNoEntry(t *testing.T) {
	for _, untrackFirst := range []bool{false, true} {
		o := NewObserver()
		o.Track("race")
		oc, _ := o.wrap(&sink{}, "p-c1", ConnHooks{})
		tr := o.lookup("race") // the bind's lookup, before Untrack
		if untrackFirst {
			o.Untrack("race")
		}
		oc.mu.Lock()
		oc.attach(tr, 1, 10)
		oc.mu.Unlock()
		if !untrackFirst {
			o.Untrack("race")
		}
		oc.mu.Lock()
		left := len(oc.streams)
		oc.mu.Unlock()
		if left != 0 {
			t.Fatalf("untrack first=%v: %d stream entries left after Untrack", untrackFirst, left)
		}
	}
}

// wireSink is a net.Conn that records what reaches it and serves reads
// from a buffer.
type wireSink struct {
	net.Conn
	r   *bytes.Reader
	out bytes.Buffer
}

func (s *wireSink) Write(b []byte) (int, error) { return s.out.Write(b) }
func (s *wireSink) Read(b []byte) (int, error)  { return s.r.Read(b) }
func (s *wireSink) Close() error                { return nil }

// Once a GOAWAY (last-stream id 1) has been read, the frames the client
// writes for stream 3 and above are kept off the wire, except HEADERS,
// whatever the Write calls split: a frame whose header a Write leaves
// incomplete is held until its stream id is known, and the RST_STREAM
// whose header straddles the GOAWAY is dropped whole. Nothing else
// changes, and every byte is accepted. Without a GOAWAY the bytes pass
// unchanged.
func TestObserverDropsFramesForStreamsAGoAwayRefusedAcrossArbitrarySplits(t *testing.T) {
	pre := clientBytes(t, []string{"a1", "a2"}, true)
	var post, want bytes.Buffer
	fr := http2.NewFramer(&post, nil)
	wfr := http2.NewFramer(&want, nil)
	both := func(write func(*http2.Framer) error, kept bool) {
		if err := write(fr); err != nil {
			t.Fatal(err)
		}
		if kept {
			_ = write(wfr)
		}
	}
	both(func(f *http2.Framer) error { return f.WriteRSTStream(3, http2.ErrCodeCancel) }, false)
	both(func(f *http2.Framer) error { return f.WriteWindowUpdate(3, 100) }, false)
	both(func(f *http2.Framer) error { return f.WriteWindowUpdate(0, 100) }, true)
	both(func(f *http2.Framer) error { return f.WritePing(false, [8]byte{1}) }, true)
	both(func(f *http2.Framer) error { return f.WriteWindowUpdate(1, 100) }, true)
	both(func(f *http2.Framer) error { return f.WriteData(5, false, []byte("late body")) }, false)
	both(func(f *http2.Framer) error {
		return f.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: []byte{0x82}, EndHeaders: true})
	}, true)
	both(func(f *http2.Framer) error { return f.WriteRSTStream(1, http2.ErrCodeCancel) }, true)
	var in bytes.Buffer
	sfr := http2.NewFramer(&in, nil)
	_ = sfr.WriteSettings()
	_ = sfr.WriteGoAway(1, http2.ErrCodeNo, nil)

	// The GOAWAY is read 4 bytes into the first RST_STREAM's header.
	wire := append(append([]byte(nil), pre...), post.Bytes()...)
	cut := len(pre) + 4
	for _, goAway := range []bool{true, false} {
		for seed := uint64(0); seed < 100; seed++ {
			o := NewObserver()
			o.Track("a1")
			s := &wireSink{r: bytes.NewReader(in.Bytes())}
			dropped := 0
			oc, _ := o.wrap(s, "p-c1", ConnHooks{Dropped: func(n int) { dropped += n }})
			rng := rand.New(rand.NewPCG(seed, 11))
			write := func(b []byte) {
				for len(b) > 0 {
					n := min(len(b), 1+rng.IntN(30))
					if got, err := oc.Write(b[:n]); err != nil || got != n {
						t.Fatalf("Write(%d bytes) = %d, %v", n, got, err)
					}
					b = b[n:]
				}
			}
			write(wire[:cut])
			if goAway {
				if _, err := oc.Read(make([]byte, 1024)); err != nil {
					t.Fatal(err)
				}
			}
			write(wire[cut:])
			expect, drops := wire, 0
			if goAway {
				expect, drops = append(append([]byte(nil), pre...), want.Bytes()...), 3
			}
			if !bytes.Equal(s.out.Bytes(), expect) || dropped != drops {
				t.Fatalf("goaway=%v seed=%d: %d frames dropped (want %d), wire\n%x\nwant\n%x", goAway, seed, dropped, drops, s.out.Bytes(), expect)
			}
			if f := o.Stream("a1", nil); f.MappingLost || f.StreamID != 1 || oc.pingsOut != 1 {
				t.Fatalf("goaway=%v seed=%d: observer %+v, pings %d", goAway, seed, f, oc.pingsOut)
			}
		}
	}
}
