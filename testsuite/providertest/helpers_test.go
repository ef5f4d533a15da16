package providertest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// testTimeout guards against hangs. It is never an assertion about how
// fast something is, only a bound after which a test fails instead of
// blocking the whole run.
const testTimeout = 10 * time.Second

func newTestProvider(t testing.TB, opts ...Option) *Provider {
	t.Helper()
	p, err := NewProvider(opts...)
	if err != nil {
		t.Fatalf("NewProvider: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// tlsTransport is a bare HTTP/2 transport for the TLS listener.
func tlsTransport(t testing.TB, p *Provider) *http2.Transport {
	tr := &http2.Transport{TLSClientConfig: p.ClientTLSConfig()}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// h2cTransport is a bare HTTP/2 transport speaking prior-knowledge h2c.
func h2cTransport(t testing.TB) *http2.Transport {
	tr := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// chatReq builds a chat-completions request. Its body is a
// strings.Reader, so net/http sets GetBody and the transport may replay
// it.
func chatReq(t testing.TB, ctx context.Context, base string, stream bool, key, attempt string) *http.Request {
	t.Helper()
	body := fmt.Sprintf(`{"model":"gpt-test","messages":[{"role":"user","content":"hello there"}],"stream":%t}`, stream)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatalf("NewRequest: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer test-key")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if attempt != "" {
		req.Header.Set("X-Durallm-Attempt", attempt)
	}
	return req
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// roundTrip sends req and reads the whole response body.
func roundTrip(tr http.RoundTripper, req *http.Request) (*http.Response, []byte, error) {
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// waitFor polls cond until it holds, failing the test after testTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// sseEvents reads SSE "data:" payloads from r, n at a time.
type sseReader struct{ br *bufio.Reader }

func (s sseReader) next() (string, error) {
	for {
		line, err := s.br.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			return data, nil
		}
	}
}

type chunkJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func decodeChunk(t testing.TB, data string) chunkJSON {
	t.Helper()
	var c chunkJSON
	if err := json.Unmarshal([]byte(data), &c); err != nil {
		t.Fatalf("chunk %q: %v", data, err)
	}
	return c
}

// rawConn is a hand-driven HTTP/2 client over h2c, for asserting exact
// frames (GOAWAY ids, RST codes, flow control) and for sending input no
// real client would.
type rawConn struct {
	t        testing.TB
	nc       net.Conn
	fr       *http2.Framer
	hbuf     bytes.Buffer
	enc      *hpack.Encoder
	settings map[http2.SettingID]uint32 // the provider's SETTINGS
}

// dialRaw connects, sends the preface and settings, and reads the
// provider's SETTINGS.
func dialRaw(t testing.TB, p *Provider, settings ...http2.Setting) *rawConn {
	t.Helper()
	rc := dialRawNoPreface(t, p)
	if _, err := io.WriteString(rc.nc, http2.ClientPreface); err != nil {
		t.Fatalf("write preface: %v", err)
	}
	if err := rc.fr.WriteSettings(settings...); err != nil {
		t.Fatalf("write settings: %v", err)
	}
	f := rc.next()
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		t.Fatalf("first frame from provider = %v, want SETTINGS", f)
	}
	rc.settings = make(map[http2.SettingID]uint32)
	_ = sf.ForeachSetting(func(s http2.Setting) error {
		rc.settings[s.ID] = s.Val
		return nil
	})
	if err := rc.fr.WriteSettingsAck(); err != nil {
		t.Fatalf("write settings ack: %v", err)
	}
	return rc
}

// dialRawNoPreface connects to the h2c listener and sends nothing.
func dialRawNoPreface(t testing.TB, p *Provider) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", strings.TrimPrefix(p.H2CURL(), "http://"))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(testTimeout))
	rc := &rawConn{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	rc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	rc.enc = hpack.NewEncoder(&rc.hbuf)
	return rc
}

// headerBlock hpack-encodes a request header list.
func (rc *rawConn) headerBlock(fields ...hpack.HeaderField) []byte {
	rc.hbuf.Reset()
	for _, f := range fields {
		_ = rc.enc.WriteField(f)
	}
	return bytes.Clone(rc.hbuf.Bytes())
}

func requestFields(attempt string) []hpack.HeaderField {
	return []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":authority", Value: "127.0.0.1"},
		{Name: ":path", Value: "/v1/chat/completions"},
		{Name: "content-type", Value: "application/json"},
		{Name: "x-durallm-attempt", Value: attempt},
	}
}

// request opens stream id with a complete request carrying attempt id
// and body (no DATA frame if body is empty).
func (rc *rawConn) request(id uint32, attempt, body string) {
	rc.t.Helper()
	err := rc.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID:      id,
		BlockFragment: rc.headerBlock(requestFields(attempt)...),
		EndStream:     body == "",
		EndHeaders:    true,
	})
	if err == nil && body != "" {
		err = rc.fr.WriteData(id, true, []byte(body))
	}
	if err != nil {
		rc.t.Fatalf("write request: %v", err)
	}
}

// next reads one frame, failing the test on error.
func (rc *rawConn) next() http2.Frame {
	rc.t.Helper()
	f, err := rc.fr.ReadFrame()
	if err != nil {
		rc.t.Fatalf("read frame: %v", err)
	}
	return f
}

// nextReal reads the next frame that is not connection housekeeping
// (SETTINGS, WINDOW_UPDATE, PING ack).
func (rc *rawConn) nextReal() http2.Frame {
	rc.t.Helper()
	for {
		f := rc.next()
		switch f := f.(type) {
		case *http2.SettingsFrame, *http2.WindowUpdateFrame:
			continue
		case *http2.PingFrame:
			if f.IsAck() {
				continue
			}
		}
		return f
	}
}

type goAwayInfo struct {
	last  uint32
	code  http2.ErrCode
	debug string
}

// expectGoAway reads up to the next GOAWAY, failing on any stream frame.
func (rc *rawConn) expectGoAway() goAwayInfo {
	rc.t.Helper()
	f := rc.nextReal()
	ga, ok := f.(*http2.GoAwayFrame)
	if !ok {
		rc.t.Fatalf("got %v, want GOAWAY", f)
	}
	return goAwayInfo{last: ga.LastStreamID, code: ga.ErrCode, debug: string(ga.DebugData())}
}

// expectClosed reads until the provider closes the connection, failing
// on any frame other than housekeeping, and then closes our side as a
// real client would.
func (rc *rawConn) expectClosed() {
	rc.t.Helper()
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				rc.t.Fatalf("connection not closed: %v", err)
			}
			// EOF, or a reset by the peer: either way it closed.
			_ = rc.nc.Close()
			return
		}
		switch f.(type) {
		case *http2.SettingsFrame, *http2.WindowUpdateFrame, *http2.PingFrame:
			continue
		}
		rc.t.Fatalf("got %v, want connection close", f)
	}
}

// response collects one stream's response frames until END_STREAM or
// RST_STREAM.
type rawResponse struct {
	status string
	header map[string]string
	body   []byte
	rst    *http2.ErrCode
}

func (rc *rawConn) readResponse(id uint32) rawResponse {
	rc.t.Helper()
	var r rawResponse
	for {
		f := rc.nextReal()
		if f.Header().StreamID != id {
			rc.t.Fatalf("unexpected frame %v while reading stream %d", f, id)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			r.status = f.PseudoValue("status")
			r.header = map[string]string{}
			for _, hf := range f.RegularFields() {
				r.header[hf.Name] = hf.Value
			}
			if f.StreamEnded() {
				return r
			}
		case *http2.DataFrame:
			r.body = append(r.body, f.Data()...)
			if f.StreamEnded() {
				return r
			}
		case *http2.RSTStreamFrame:
			code := f.ErrCode
			r.rst = &code
			return r
		default:
			rc.t.Fatalf("unexpected frame %v", f)
		}
	}
}

// ping sends a PING and waits for its ACK, proving the connection is
// still being served; it fails on any stream frame in between.
func (rc *rawConn) ping() {
	rc.t.Helper()
	data := [8]byte{'d', 'u', 'r', 'a', 'l', 'l', 'm', '!'}
	if err := rc.fr.WritePing(false, data); err != nil {
		rc.t.Fatalf("write ping: %v", err)
	}
	for {
		f := rc.next()
		switch f := f.(type) {
		case *http2.SettingsFrame, *http2.WindowUpdateFrame:
			continue
		case *http2.PingFrame:
			if f.IsAck() && f.Data == data {
				return
			}
		}
		rc.t.Fatalf("got %v, want PING ack", f)
	}
}
