package recovery

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/durallm/durallm/evidence"
	"golang.org/x/net/http2"
)

// Probe is what Engine.Probe found out about a route's server without
// sending it a request.
type Probe struct {
	// Speaks is the protocol the engine will speak to the server,
	// "HTTP/2.0" or "HTTP/1.1".
	Speaks string
	// Checked reports that the server itself confirmed it (ALPN, or an
	// answer to the HTTP/2 preface). Plain HTTP/1.1 is not checked: that
	// would take a request.
	Checked bool
	// Mismatch is set when the server speaks another protocol than the
	// route asks for (the values of Evidence.ProtocolMismatch); every
	// attempt on the route would then be unsent.
	Mismatch string
}

// Fix says what to change when p has a mismatch, "" otherwise.
func (p Probe) Fix() string {
	switch p.Mismatch {
	case evidence.MismatchHTTP11:
		return `the server speaks HTTP/1.1: set the route's http_version to "1.1" (or "auto" without --allow-h2c)`
	case evidence.MismatchHTTP2:
		return `the server speaks only cleartext HTTP/2: set the route's http_version to "2"`
	case evidence.MismatchNotHTTP2:
		return `the server closed the connection at the HTTP/2 preface: if it speaks HTTP/1.1, set the route's http_version to "1.1"`
	}
	return ""
}

// ErrProbeNoAnswer: the server answered the HTTP/2 preface with nothing
// before the probe's context ended.
var ErrProbeNoAnswer = errors.New("recovery: no answer to the HTTP/2 preface")

// Probe checks, cheaply and without sending a request, which protocol the
// engine will speak to baseURL for a request sent as v: over TLS it makes
// the handshake with the ALPN offer a request would make; over cleartext
// HTTP/2 it sends the connection preface and reads the server's first
// bytes (an HTTP/1.1 server answers it with a status line: it reads
// "PRI * HTTP/2.0" as a request, which never reaches a model). Cleartext
// HTTP/1.1 is only dialed. For HTTPVersionAuto the engine remembers an
// HTTP/1.1 answer, as a request would have taught it. ctx bounds it.
func (e *Engine) Probe(ctx context.Context, baseURL string, v HTTPVersion) (Probe, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return Probe{}, fmt.Errorf("recovery: probe: %w", ErrUnsupportedScheme)
	}
	scheme, authority := u.Scheme, authorityOf(u.Scheme, u.Host)
	if scheme != "http" && scheme != "https" {
		return Probe{}, fmt.Errorf("%w %q", ErrUnsupportedScheme, scheme)
	}
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	raw, err := e.cfg.DialContext(dctx, "tcp", authority)
	if err != nil {
		return Probe{}, fmt.Errorf("recovery: probe: dial %s: %w", authority, err)
	}
	defer raw.Close()
	stop := context.AfterFunc(dctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	learn := func(p Probe) Probe {
		if v == HTTPVersionAuto && p.Mismatch == evidence.MismatchHTTP11 {
			e.learnHTTP1(scheme, authority)
			p.Speaks, p.Mismatch = evidence.ProtoHTTP11, "" // auto: HTTP/1.1 is what it will speak now
		}
		return p
	}
	h1 := e.useHTTP1(v, scheme, authority)
	if scheme == "https" {
		protos := []string{http2.NextProtoTLS, "http/1.1"}
		switch {
		case h1:
			protos = []string{"http/1.1"}
		case v == HTTPVersion2:
			protos = protos[:1]
		}
		tc := tls.Client(raw, e.tlsConfig(authority, protos))
		if err := tc.HandshakeContext(dctx); err != nil {
			return Probe{}, fmt.Errorf("recovery: probe: TLS handshake with %s: %w", authority, err)
		}
		if tc.ConnectionState().NegotiatedProtocol == http2.NextProtoTLS {
			return Probe{Speaks: evidence.ProtoHTTP2, Checked: true}, nil
		}
		p := Probe{Speaks: evidence.ProtoHTTP11, Checked: true}
		if !h1 {
			p.Mismatch = evidence.MismatchHTTP11
		}
		return learn(p), nil
	}
	if h1 {
		return Probe{Speaks: evidence.ProtoHTTP11}, nil
	}
	// The client preface and an empty SETTINGS frame, as a connection's
	// first bytes; then the server's first bytes say what it speaks.
	if _, err := io.WriteString(raw, clientPreface+"\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		return Probe{}, fmt.Errorf("recovery: probe: write to %s: %w", authority, err)
	}
	var first [9]byte
	n, err := io.ReadFull(raw, first[:])
	switch {
	case n >= len(http1StatusPrefix) && string(first[:len(http1StatusPrefix)]) == http1StatusPrefix:
		return learn(Probe{Speaks: evidence.ProtoHTTP2, Checked: true, Mismatch: evidence.MismatchHTTP11}), nil
	case err == nil && looksLikeSettingsFrame(first[:]):
		return Probe{Speaks: evidence.ProtoHTTP2, Checked: true}, nil
	case n == 0 && (errors.Is(err, io.EOF) || !isTimeout(err)):
		return Probe{Speaks: evidence.ProtoHTTP2, Checked: true, Mismatch: evidence.MismatchNotHTTP2}, nil
	case isTimeout(err):
		return Probe{Speaks: evidence.ProtoHTTP2}, fmt.Errorf("%w from %s", ErrProbeNoAnswer, authority)
	default:
		return Probe{Speaks: evidence.ProtoHTTP2}, fmt.Errorf("recovery: probe: %s answered the HTTP/2 preface with something else", authority)
	}
}
