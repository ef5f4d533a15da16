package recovery

import (
	"context"
	"fmt"
)

// HTTPVersion says which HTTP version a request must be sent with. It is
// a route's http_version setting (docs/providers.md).
type HTTPVersion string

// The HTTP versions a route may ask for.
const (
	// HTTPVersionAuto (also the empty value): over TLS, what ALPN
	// negotiates (the engine offers h2 and http/1.1); over cleartext
	// http://, HTTP/1.1, unless Config.AllowH2C is set, which makes it
	// cleartext HTTP/2 with prior knowledge (h2c).
	HTTPVersionAuto HTTPVersion = "auto"
	// HTTPVersion2: HTTP/2 only: ALPN h2 over TLS, h2c with prior
	// knowledge over cleartext (whatever Config.AllowH2C says: the route
	// asked for it).
	HTTPVersion2 HTTPVersion = "2"
	// HTTPVersion11: HTTP/1.1 only (ALPN http/1.1 over TLS).
	HTTPVersion11 HTTPVersion = "1.1"
)

// ErrBadHTTPVersion is wrapped by ParseHTTPVersion's error.
var ErrBadHTTPVersion = fmt.Errorf(`recovery: http_version must be "auto", "2" or "1.1"`)

// ParseHTTPVersion reads a route's http_version: "" and "auto" are
// HTTPVersionAuto, "2" is HTTPVersion2, "1.1" is HTTPVersion11.
func ParseHTTPVersion(s string) (HTTPVersion, error) {
	switch HTTPVersion(s) {
	case "", HTTPVersionAuto:
		return HTTPVersionAuto, nil
	case HTTPVersion2, HTTPVersion11:
		return HTTPVersion(s), nil
	}
	return "", ErrBadHTTPVersion
}

type versionKey struct{}

// WithHTTPVersion returns a context that makes the Engine send the request
// made with it in version v. Without it a request is sent as
// HTTPVersionAuto. providers/exchange sets it from the route.
func WithHTTPVersion(ctx context.Context, v HTTPVersion) context.Context {
	return context.WithValue(ctx, versionKey{}, v)
}

func versionFrom(ctx context.Context) HTTPVersion {
	v, _ := ctx.Value(versionKey{}).(HTTPVersion)
	if v == "" {
		return HTTPVersionAuto
	}
	return v
}
