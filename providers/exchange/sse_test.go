package exchange

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

type sseEvent struct{ name, data string }

func decodeAll(t *testing.T, r io.Reader) ([]sseEvent, error) {
	t.Helper()
	d := newSSEDecoder(r)
	var out []sseEvent
	for {
		name, data, err := d.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, sseEvent{name, string(data)})
	}
}

func TestSSEDecoder(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []sseEvent
	}{
		{"lf", "data: a\n\ndata: b\n\n", []sseEvent{{"", "a"}, {"", "b"}}},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []sseEvent{{"", "a"}, {"", "b"}}},
		{"lone cr", "data: a\r\rdata: b\r\r", []sseEvent{{"", "a"}, {"", "b"}}},
		{"mixed terminators", "data: a\r\n\ndata: b\n\r\n", []sseEvent{{"", "a"}, {"", "b"}}},
		{"multi-line data", "data: one\ndata: two\ndata:three\n\n", []sseEvent{{"", "one\ntwo\nthree"}}},
		{"comments and keep-alives", ": keep-alive\n\n: OPENROUTER PROCESSING\ndata: x\n: mid-event comment\n\n", []sseEvent{{"", "x"}}},
		{"only comments", ": ping\n\n: ping\n\n", nil},
		{"event, id and retry fields", "event: error\nid: 7\nretry: 100\ndata: {}\n\ndata: y\n\n", []sseEvent{{"error", "{}"}, {"", "y"}}},
		{"event without data is dropped", "event: ping\n\ndata: z\n\n", []sseEvent{{"", "z"}}},
		{"no space after colon", "data:tight\n\n", []sseEvent{{"", "tight"}}},
		{"only one space stripped", "data:  two spaces\n\n", []sseEvent{{"", " two spaces"}}},
		{"field without colon", "data\n\n", []sseEvent{{"", ""}}},
		{"unknown fields ignored", "foo: bar\ndata: q\n\n", []sseEvent{{"", "q"}}},
		{"done without blank line at eof", "data: a\n\ndata: [DONE]", []sseEvent{{"", "a"}, {"", "[DONE]"}}},
		{"done with newline at eof", "data: [DONE]\n", []sseEvent{{"", "[DONE]"}}},
		{"empty", "", nil},
		{"blank lines only", "\n\n\r\n", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []struct {
				name string
				r    io.Reader
			}{
				{"whole", strings.NewReader(tc.in)},
				{"one byte at a time", iotest.OneByteReader(strings.NewReader(tc.in))},
			} {
				got, err := decodeAll(t, r.r)
				if err != nil {
					t.Fatalf("%s: %v", r.name, err)
				}
				if len(got) != len(tc.want) {
					t.Fatalf("%s: got %q, want %q", r.name, got, tc.want)
				}
				for i := range got {
					if got[i] != tc.want[i] {
						t.Fatalf("%s: event %d = %q, want %q", r.name, i, got[i], tc.want[i])
					}
				}
			}
		})
	}
}

// endless is a hostile body: one line that never ends.
type endless struct{ n int64 }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	e.n += int64(len(p))
	return len(p), nil
}

func TestSSEEndlessLineIsBounded(t *testing.T) {
	src := &endless{}
	_, err := decodeAll(t, src)
	if !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("err = %v, want ErrLineTooLong", err)
	}
	// The decoder stops within one read buffer of the limit: it never
	// reads (or holds) the line's unbounded remainder.
	if limit := int64(MaxSSELineBytes + 2*sseReadBuffer); src.n > limit {
		t.Fatalf("read %d bytes of an endless line, want at most %d", src.n, limit)
	}
}

func TestSSEEventDataIsBounded(t *testing.T) {
	line := "data: " + strings.Repeat("b", 1000) + "\n"
	var in strings.Builder
	for in.Len() < MaxSSELineBytes*11/10 {
		in.WriteString(line)
	}
	in.WriteString("\n")
	_, err := decodeAll(t, strings.NewReader(in.String()))
	if !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("err = %v, want ErrEventTooLarge", err)
	}
	// A line of exactly the limit is fine.
	ok := "data: " + strings.Repeat("c", MaxSSELineBytes-len("data: ")) + "\n\n"
	got, err := decodeAll(t, strings.NewReader(ok))
	if err != nil || len(got) != 1 {
		t.Fatalf("line at the limit: %v, %d events", err, len(got))
	}
}

func TestSSEReaderErrorSurfaces(t *testing.T) {
	boom := errors.New("boom")
	_, err := decodeAll(t, io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom)))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the reader's error", err)
	}
}

// FuzzSSE feeds arbitrary bytes through the SSE decoder and the stream
// accumulator of each dialect. It must never panic, must stay within its
// bounds, and what reaches the sink must be exactly the accumulated text,
// with the commit reported once and before any delta.
func FuzzSSE(f *testing.F) {
	seeds := []string{
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n",
		": keep-alive\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n",
		"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\"}}]}}]}\r\rdata: [DONE]",
		"event: error\ndata: {\"type\":\"overloaded_error\"}\n\n",
		"data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"multi\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"refusal\":\"no\"},\"finish_reason\":\"stop\"}],\"usage\":{\"total_tokens\":\"3\"}}\n\n",
		"data: not json\n\n",
		"data: {\"choices\":[{\"index\":\"1\",\"delta\":{\"content\":\"other\"}}]}\n\n",
		"\r\n\r\r\n:\n:x\ndata\ndata:\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":[{\"type\":\"text\",\"text\":\"p\"},\"q\"]}}]}\n\n",
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":3}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
		"data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\"}}\n\n",
		"event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":\"9\"}}\n\nevent: message_stop\ndata: {}\n\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, newAcc := range []func() *streamAcc{newStreamAcc, newAnthropicStreamAcc} {
			fuzzOneDialect(t, in, newAcc())
		}
	})
}

func fuzzOneDialect(t *testing.T, in []byte, acc *streamAcc) {
	t.Helper()
	acc.limit = 1 << 16
	var sunk strings.Builder
	commits, deltasBeforeCommit := 0, 0
	err := consumeStream(newSSEDecoder(bytes.NewReader(in)), acc, streamHooks{
		commit: func() { commits++ },
		delta: func(s string) {
			if commits == 0 {
				deltasBeforeCommit++
			}
			sunk.WriteString(s)
		},
	})
	if err != nil && !errors.Is(err, ErrMalformedStream) && !errors.Is(err, errProviderError) && !errors.Is(err, ErrTruncatedBody) &&
		!errors.Is(err, ErrResponseTooLarge) && !errors.Is(err, ErrLineTooLong) && !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("unexpected error %v", err)
	}
	if commits > 1 || deltasBeforeCommit > 0 {
		t.Fatalf("commits %d, deltas before commit %d", commits, deltasBeforeCommit)
	}
	r := acc.response()
	if r.Text != sunk.String() {
		t.Fatalf("sink got %q, accumulated %q", sunk.String(), r.Text)
	}
	if (commits == 1) != acc.content {
		t.Fatalf("commit %d but content started %v", commits, acc.content)
	}
	if acc.size > acc.limit {
		t.Fatalf("accumulated %d bytes past the limit %d", acc.size, acc.limit)
	}
	if len(r.Text)+len(r.Refusal) > acc.limit {
		t.Fatalf("response larger than the limit")
	}
}

// At a clean end of the body, a last event without its blank line is a
// cut when its data is not complete (ErrTruncatedBody), and read as usual
// when it is: providers end with "data: [DONE]" and no blank line. A
// terminated event that is not JSON stays malformed. Both dialects.
func TestUnterminatedFinalEvent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		wantErr error
		done    bool
	}{
		{"cut mid-line", "data: {\"choices\":[{\"delta\":{\"content\":\"hel", ErrTruncatedBody, false},
		{"cut after a data line", "data: {\"choices\":\n", ErrTruncatedBody, false},
		{"cut mid-[DONE]", "data: [DO", ErrTruncatedBody, false},
		{"[DONE] without a blank line", "data: [DONE]", nil, true},
		{"[DONE] and one newline", "data: [DONE]\n", nil, true},
		{"complete JSON without a blank line", "data: {\"type\":\"message_stop\"}", nil, false},
		{"an empty data field", "data:", nil, false},
		{"a field with no data", "event: content_block_delta\n", nil, false},
		{"terminated, not JSON", "data: {not json\n\n", ErrMalformedStream, false},
	} {
		for _, d := range []struct {
			name   string
			newAcc func() *streamAcc
			done   bool
		}{{"openai", newStreamAcc, tc.done}, {"anthropic", newAnthropicStreamAcc, tc.done || tc.name == "complete JSON without a blank line"}} {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				acc := d.newAcc()
				err := consumeStream(newSSEDecoder(strings.NewReader(tc.in)), acc, streamHooks{})
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				if errors.Is(err, ErrTruncatedBody) && errors.Is(err, ErrMalformedStream) {
					t.Fatalf("err %v is both truncated and malformed", err)
				}
				if acc.done != d.done {
					t.Fatalf("done = %v, want %v", acc.done, d.done)
				}
			})
		}
	}
}
