package evidence

// The values of Evidence.HTTPVersion.
const (
	ProtoHTTP2  = "HTTP/2.0"
	ProtoHTTP11 = "HTTP/1.1"
)

// The values of Evidence.ProtocolMismatch: what the server turned out to
// speak, when it was not what the engine tried.
const (
	// MismatchHTTP11: the server answered the HTTP/2 preface with an
	// HTTP/1.x status line, or ALPN chose http/1.1 (or nothing) where the
	// route asked for HTTP/2.
	MismatchHTTP11 = "HTTP/1.1"
	// MismatchHTTP2: the server answered an HTTP/1.1 request with an
	// HTTP/2 frame (an h2c-only server).
	MismatchHTTP2 = "HTTP/2"
	// MismatchNotHTTP2: a cleartext server closed the connection without
	// sending a single byte after the HTTP/2 preface, where an HTTP/2
	// server must first send SETTINGS.
	MismatchNotHTTP2 = "not HTTP/2"
)
