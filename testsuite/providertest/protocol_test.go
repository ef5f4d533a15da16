package providertest

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// scriptByAttempt routes requests to behaviours by their attempt id.
func scriptByAttempt(p *Provider, m map[string]Behavior) {
	p.Script(func(r Request) (Behavior, bool) {
		b, ok := m[r.AttemptID]
		return b, ok
	})
}

func TestRawSettingsPingPriority(t *testing.T) {
	p := newTestProvider(t, WithMaxConcurrentStreams(7))
	rc := dialRaw(t, p)
	if got := rc.settings[http2.SettingMaxConcurrentStreams]; got != 7 {
		t.Errorf("MAX_CONCURRENT_STREAMS = %d, want 7", got)
	}
	// Our SETTINGS must be acknowledged.
	if f, ok := rc.next().(*http2.SettingsFrame); !ok || !f.IsAck() {
		t.Fatalf("want SETTINGS ack, got %v", f)
	}
	rc.ping()
	if err := rc.fr.WritePriority(1, http2.PriorityParam{StreamDep: 0, Weight: 10}); err != nil {
		t.Fatal(err)
	}
	rc.request(1, "a", `{"model":"m"}`)
	if r := rc.readResponse(1); r.status != "200" || !strings.Contains(string(r.body), `"ok"`) {
		t.Fatalf("response %+v", r)
	}
}

func TestRawGoAwayAboveKeepsServingLowerStreams(t *testing.T) {
	p := newTestProvider(t)
	gate := make(chan struct{})
	scriptByAttempt(p, map[string]Behavior{
		"held":   Answer("held answer").WaitFor(gate),
		"goaway": GoAwayAbove(http2.ErrCodeNo),
	})
	rc := dialRaw(t, p)
	rc.request(1, "held", "")
	waitFor(t, "stream 1 executing", func() bool { return p.AttemptExecutions("held") == 1 })
	rc.request(3, "goaway", `{"model":"m"}`)
	ga := rc.expectGoAway()
	if ga.last != 1 || ga.code != http2.ErrCodeNo || ga.debug != "durallm-providertest" {
		t.Fatalf("GOAWAY %+v, want last 1, NO_ERROR, durallm-providertest", ga)
	}
	// A stream opened after the GOAWAY is ignored, but recorded.
	rc.request(5, "late", "")
	waitFor(t, "stream 5 recorded", func() bool { return len(p.Received()) == 3 })
	if got := p.Received()[2]; got.StreamID != 5 || got.Behavior != BehaviorIgnored {
		t.Errorf("late stream record %+v", got)
	}
	close(gate)
	if r := rc.readResponse(1); r.status != "200" || !strings.Contains(string(r.body), "held answer") {
		t.Fatalf("stream 1 response %+v", r)
	}
	// Nothing for streams 3 and 5; the connection closes once 1 is done.
	rc.expectClosed()
	if got := p.Processed(); len(got) != 1 || got[0].AttemptID != "held" {
		t.Errorf("Processed = %+v", got)
	}
}

func TestRawGoAwayAboveTwice(t *testing.T) {
	p := newTestProvider(t)
	p.Push(Answer("first"), GoAwayAboveTwice(http2.ErrCodeEnhanceYourCalm, http2.ErrCodeNo))
	rc := dialRaw(t, p)
	rc.request(1, "a1", "")
	if r := rc.readResponse(1); r.status != "200" {
		t.Fatalf("stream 1: %+v", r)
	}
	rc.request(3, "a3", "")
	first, second := rc.expectGoAway(), rc.expectGoAway()
	if first.last != 1 || first.code != http2.ErrCodeEnhanceYourCalm || second.last != 1 || second.code != http2.ErrCodeNo {
		t.Fatalf("GOAWAYs %+v then %+v, want last 1 ENHANCE_YOUR_CALM then last 1 NO_ERROR", first, second)
	}
	rc.expectClosed()
	if len(p.Processed()) != 1 || p.Received()[1].Behavior != "GoAwayAboveTwice(ENHANCE_YOUR_CALM,NO_ERROR)" {
		t.Errorf("Processed = %+v, Received = %+v", p.Processed(), p.Received())
	}
}

func TestRawGoAwayAfterProcessing(t *testing.T) {
	p := newTestProvider(t)
	p.Push(Answer("first"), GoAwayAfterProcessing(http2.ErrCodeEnhanceYourCalm))
	rc := dialRaw(t, p)
	rc.request(1, "a1", "")
	if r := rc.readResponse(1); r.status != "200" {
		t.Fatalf("stream 1: %+v", r)
	}
	rc.request(3, "a3", "")
	ga := rc.expectGoAway()
	if ga.last != 3 || ga.code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %+v, want last 3 ENHANCE_YOUR_CALM", ga)
	}
	rc.expectClosed()
	if p.AttemptExecutions("a3") != 1 {
		t.Errorf("Processed = %+v", p.Processed())
	}
}

func TestRawGoAwayAt(t *testing.T) {
	t.Run("covers this stream, not processed", func(t *testing.T) {
		p := newTestProvider(t)
		p.Push(GoAwayAt(9, http2.ErrCodeNo, false))
		rc := dialRaw(t, p)
		rc.request(1, "a", "")
		if ga := rc.expectGoAway(); ga.last != 9 {
			t.Fatalf("GOAWAY %+v, want last 9", ga)
		}
		rc.expectClosed()
		if len(p.Processed()) != 0 {
			t.Errorf("Processed = %+v", p.Processed())
		}
	})
	t.Run("below this stream, processed anyway", func(t *testing.T) {
		p := newTestProvider(t)
		p.Push(GoAwayAt(0, http2.ErrCodeProtocol, true))
		rc := dialRaw(t, p)
		rc.request(1, "a", "")
		if ga := rc.expectGoAway(); ga.last != 0 || ga.code != http2.ErrCodeProtocol {
			t.Fatalf("GOAWAY %+v, want last 0 PROTOCOL_ERROR", ga)
		}
		rc.expectClosed()
		if len(p.Processed()) != 1 {
			t.Errorf("Processed = %+v", p.Processed())
		}
	})
}

func TestRawGoAwayAboveClosesAfterBound(t *testing.T) {
	p := newTestProvider(t)
	scriptByAttempt(p, map[string]Behavior{
		"hold":   Hold(),
		"goaway": GoAwayAbove(http2.ErrCodeNo),
	})
	rc := dialRaw(t, p)
	rc.request(1, "hold", "")
	waitFor(t, "stream 1 held", func() bool { return p.AttemptExecutions("hold") == 1 })
	rc.request(3, "goaway", "")
	if ga := rc.expectGoAway(); ga.last != 1 {
		t.Fatalf("GOAWAY %+v", ga)
	}
	// Stream 1 never finishes; the bound closes the connection anyway.
	rc.expectClosed()
	waitFor(t, "streams ended", func() bool { return p.StreamsOpen() == 0 && p.ConnsOpen() == 0 })
}

func TestRawDrain(t *testing.T) {
	p := newTestProvider(t)
	gate := make(chan struct{})
	scriptByAttempt(p, map[string]Behavior{"slow": Answer("slow answer").WaitFor(gate)})
	rc := dialRaw(t, p)
	rc.request(1, "fast", "")
	if r := rc.readResponse(1); r.status != "200" {
		t.Fatalf("stream 1: %+v", r)
	}
	rc.request(3, "slow", "")
	waitFor(t, "stream 3 executing", func() bool { return p.AttemptExecutions("slow") == 1 })

	p.Drain(http2.ErrCodeNo)
	if ga := rc.expectGoAway(); ga.last != 3 || ga.code != http2.ErrCodeNo {
		t.Fatalf("GOAWAY %+v, want last 3 NO_ERROR", ga)
	}
	rc.request(5, "after-drain", "")
	close(gate)
	if r := rc.readResponse(3); r.status != "200" || !strings.Contains(string(r.body), "slow answer") {
		t.Fatalf("stream 3: %+v", r)
	}
	rc.expectClosed()
	if p.AttemptExecutions("after-drain") != 0 {
		t.Error("a stream opened after the drain GOAWAY was executed")
	}
}

func TestRawFlowControl(t *testing.T) {
	p := newTestProvider(t)
	text := strings.Repeat("word ", 100)
	p.Push(Answer(text))
	const window = 16
	rc := dialRaw(t, p, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	rc.request(1, "fc", "")

	var body []byte
	var length string
	for len(body) < window {
		switch f := rc.nextReal().(type) {
		case *http2.MetaHeadersFrame:
			for _, hf := range f.RegularFields() {
				if hf.Name == "content-length" {
					length = hf.Value
				}
			}
		case *http2.DataFrame:
			body = append(body, f.Data()...)
			if len(body) > window {
				t.Fatalf("provider sent %d bytes into a %d-byte window", len(body), window)
			}
		default:
			t.Fatalf("unexpected %v", f)
		}
	}
	// The window is exhausted: no DATA may come before our PING's ack.
	rc.ping()
	if err := rc.fr.WriteWindowUpdate(1, 1<<20); err != nil {
		t.Fatal(err)
	}
	r := rc.readResponse(1)
	body = append(body, r.body...)
	var cc completionJSON
	if err := json.Unmarshal(body, &cc); err != nil || cc.Choices[0].Message.Content != text {
		t.Fatalf("body %q: %v", body, err)
	}
	if length != "" && length != itoa(len(body)) {
		t.Errorf("content-length %s, body %d", length, len(body))
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestRawMaxConcurrentStreams(t *testing.T) {
	p := newTestProvider(t, WithMaxConcurrentStreams(1))
	p.SetDefault(Hold())
	rc := dialRaw(t, p)
	rc.request(1, "a", "")
	waitFor(t, "stream 1 held", func() bool { return p.StreamsOpen() == 1 })
	rc.request(3, "b", "")
	f := rc.nextReal()
	rst, ok := f.(*http2.RSTStreamFrame)
	if !ok || rst.StreamID != 3 || rst.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("got %v, want RST_STREAM 3 REFUSED_STREAM", f)
	}
	if got := p.Received(); len(got) != 2 || got[1].Behavior != BehaviorOverLimit {
		t.Errorf("Received = %+v", got)
	}
	// A client reset of stream 1 frees the slot and ends the handler.
	if err := rc.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stream 1 ended", func() bool { return p.StreamsOpen() == 0 })
	p.SetDefault(Answer("ok"))
	rc.request(5, "c", "")
	if r := rc.readResponse(5); r.status != "200" {
		t.Fatalf("stream 5: %+v", r)
	}
}

func TestRawContinuationAndTrailers(t *testing.T) {
	p := newTestProvider(t)
	rc := dialRaw(t, p)
	fields := append(requestFields("cont"), hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("p", 30000)})
	block := rc.headerBlock(fields...)
	// HEADERS + CONTINUATION + CONTINUATION, then DATA, then trailers.
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:10000]}); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteContinuation(1, false, block[10000:20000]); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteContinuation(1, true, block[20000:]); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteData(1, false, []byte(`{"model":"cont-model"}`)); err != nil {
		t.Fatal(err)
	}
	trailer := rc.headerBlock(hpack.HeaderField{Name: "x-trailer", Value: "t"})
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: trailer, EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if r := rc.readResponse(1); r.status != "200" {
		t.Fatalf("response %+v", r)
	}
	if got := p.Received(); len(got) != 1 || got[0].AttemptID != "cont" || got[0].Model != "cont-model" {
		t.Errorf("Received = %+v", got)
	}
}

func TestRawClientGoAway(t *testing.T) {
	p := newTestProvider(t)
	rc := dialRaw(t, p)
	if err := rc.fr.WriteGoAway(0, http2.ErrCodeNo, nil); err != nil {
		t.Fatal(err)
	}
	rc.expectClosed()
}

// TestRawBadInput feeds protocol violations and checks the provider
// answers each with the right error and keeps serving new connections.
func TestRawBadInput(t *testing.T) {
	p := newTestProvider(t)
	fatal := []struct {
		name string
		code http2.ErrCode
		send func(rc *rawConn) error
	}{
		{"HEADERS on even stream", http2.ErrCodeProtocol, func(rc *rawConn) error {
			return rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: rc.headerBlock(requestFields("x")...), EndStream: true, EndHeaders: true})
		}},
		{"DATA on idle stream", http2.ErrCodeProtocol, func(rc *rawConn) error { return rc.fr.WriteData(9, true, []byte("x")) }},
		{"bad HPACK", http2.ErrCodeCompression, func(rc *rawConn) error {
			return rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff}, EndStream: true, EndHeaders: true})
		}},
		{"CONTINUATION alone", http2.ErrCodeProtocol, func(rc *rawConn) error { return rc.fr.WriteContinuation(1, true, []byte{0x82}) }},
		{"oversized frame", http2.ErrCodeFrameSize, func(rc *rawConn) error {
			return rc.fr.WriteRawFrame(http2.FrameData, 0, 1, make([]byte, 20000))
		}},
		{"window overflow", http2.ErrCodeFlowControl, func(rc *rawConn) error { return rc.fr.WriteWindowUpdate(0, 1<<31-1) }},
		{"bad SETTINGS value", http2.ErrCodeProtocol, func(rc *rawConn) error {
			return rc.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1})
		}},
		{"PUSH_PROMISE from client", http2.ErrCodeProtocol, func(rc *rawConn) error {
			return rc.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: []byte{0x82}, EndHeaders: true})
		}},
		{"RST_STREAM on idle stream", http2.ErrCodeProtocol, func(rc *rawConn) error { return rc.fr.WriteRSTStream(11, http2.ErrCodeCancel) }},
	}
	for _, tc := range fatal {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, p)
			if err := tc.send(rc); err != nil {
				t.Fatal(err)
			}
			ga := rc.expectGoAway()
			if ga.code != tc.code {
				t.Errorf("GOAWAY code %v, want %v (%q)", ga.code, tc.code, ga.debug)
			}
			rc.expectClosed()
		})
	}

	streamLevel := []struct {
		name   string
		fields []hpack.HeaderField
	}{
		{"missing :path", []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}}},
		{"upper-case name", append(requestFields("x"), hpack.HeaderField{Name: "X-Upper", Value: "v"})},
		{"unknown pseudo-header", []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":bogus", Value: "v"}, {Name: ":path", Value: "/"}}},
	}
	for _, tc := range streamLevel {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, p)
			if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: rc.headerBlock(tc.fields...), EndStream: true, EndHeaders: true}); err != nil {
				t.Fatal(err)
			}
			f := rc.nextReal()
			if rst, ok := f.(*http2.RSTStreamFrame); !ok || rst.StreamID != 1 || rst.ErrCode != http2.ErrCodeProtocol {
				t.Fatalf("got %v, want RST_STREAM 1 PROTOCOL_ERROR", f)
			}
			// The connection survives a stream error.
			rc.request(3, "fine", "")
			if r := rc.readResponse(3); r.status != "200" {
				t.Fatalf("stream 3 after stream error: %+v", r)
			}
		})
	}

	t.Run("garbage preface", func(t *testing.T) {
		rc := dialRawNoPreface(t, p)
		if _, err := io.WriteString(rc.nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(rc.nc); err != nil {
			t.Errorf("read: %v", err)
		}
	})

	// Whatever happened above, the provider still serves.
	rc := dialRaw(t, p)
	rc.request(1, "still-alive", "")
	if r := rc.readResponse(1); r.status != "200" {
		t.Fatalf("provider no longer serves: %+v", r)
	}
}

// FuzzConnInput throws arbitrary bytes after a valid preface and
// SETTINGS. The provider must neither panic nor hang; Close at the end
// proves every goroutine wound down.
func FuzzConnInput(f *testing.F) {
	frame := func(typ http2.FrameType, flags http2.Flags, stream uint32, payload []byte) []byte {
		b := make([]byte, 9, 9+len(payload))
		b[0], b[1], b[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		b[3], b[4] = byte(typ), byte(flags)
		binary.BigEndian.PutUint32(b[5:], stream)
		return append(b, payload...)
	}
	f.Add([]byte{})
	f.Add(frame(http2.FrameHeaders, http2.FlagHeadersEndHeaders|http2.FlagHeadersEndStream, 1, []byte{0x83, 0x84, 0x86}))
	f.Add(frame(http2.FrameHeaders, http2.FlagHeadersPadded, 1, []byte{200, 1}))
	f.Add(frame(http2.FrameData, http2.FlagDataPadded, 1, []byte{0}))
	f.Add(frame(http2.FrameSettings, 0, 0, []byte{0, 4, 0xff, 0xff, 0xff, 0xff}))
	f.Add(frame(http2.FrameWindowUpdate, 0, 1, []byte{0, 0, 0, 0}))
	f.Add(frame(http2.FramePriority, 0, 1, []byte{0, 0, 0, 1, 5}))
	f.Add(frame(0xfe, 0, 3, []byte("extension")))

	p := newTestProvider(f)
	f.Fuzz(func(t *testing.T, input []byte) {
		rc := dialRaw(t, p)
		if _, err := rc.nc.Write(input); err != nil {
			return
		}
		// Half-close so a provider waiting for the rest of a frame sees EOF.
		if cw, ok := rc.nc.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, rc.nc)
	})
}

// WithStrictIdleStreams: after its GOAWAY, a stream above the last-stream
// id (here one that arrived after it, and was ignored) is idle to the
// provider, as to Go's HTTP/2 server before Go 1.20. An RST_STREAM or a
// WINDOW_UPDATE for it is a connection error that also ends the stream
// still answering below the boundary; DATA for it is discarded. Without
// the option such frames are ignored, and the stream below completes.
func TestRawStrictIdleStreamsAfterGoAway(t *testing.T) {
	for _, tc := range []struct {
		name   string
		strict bool
		send   func(rc *rawConn) error
	}{
		{"strict RST_STREAM", true, func(rc *rawConn) error { return rc.fr.WriteRSTStream(3, http2.ErrCodeCancel) }},
		{"strict WINDOW_UPDATE", true, func(rc *rawConn) error { return rc.fr.WriteWindowUpdate(3, 1000) }},
		{"default RST_STREAM", false, func(rc *rawConn) error { return rc.fr.WriteRSTStream(3, http2.ErrCodeCancel) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []Option
			if tc.strict {
				opts = append(opts, WithStrictIdleStreams())
			}
			p := newTestProvider(t, opts...)
			release := make(chan struct{})
			p.Push(Answer("below").WaitFor(release))
			rc := dialRaw(t, p)
			rc.request(1, "att-below", `{"model":"m"}`)
			waitFor(t, "stream 1 to execute", func() bool { return p.AttemptExecutions("att-below") == 1 })
			p.Drain(http2.ErrCodeNo)
			if ga := rc.expectGoAway(); ga.last != 1 || ga.code != http2.ErrCodeNo {
				t.Fatalf("GOAWAY %+v", ga)
			}
			rc.request(3, "att-above", `{"model":"m"}`) // crossed the GOAWAY: ignored, DATA discarded
			if err := tc.send(rc); err != nil {
				t.Fatal(err)
			}
			if tc.strict {
				if ga := rc.expectGoAway(); ga.code != http2.ErrCodeProtocol || ga.last != 1 {
					t.Fatalf("GOAWAY %+v, want PROTOCOL_ERROR", ga)
				}
				rc.expectClosed()
				return
			}
			rc.ping()
			close(release)
			if r := rc.readResponse(1); r.status != "200" || !strings.Contains(string(r.body), "below") {
				t.Fatalf("stream 1: %+v", r)
			}
			if p.AttemptExecutions("att-above") != 0 {
				t.Fatalf("the ignored stream executed: %+v", p.Processed())
			}
		})
	}
}
