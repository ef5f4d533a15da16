package gateway

import (
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/durallm/durallm/gateway/answer"
)

// authenticate finds the caller of the request's token, read as the
// call's surface reads it; without tokens every request is the anonymous
// operator.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request, c *call) bool {
	if g.o.Tokens == nil {
		if p := localOnly(r); p != nil {
			writeProblem(w, c.surface, p)
			return false
		}
		c.caller = anonymous
		c.ri.caller = anonymous.ID
		return true
	}
	if token, ok := c.surface.Credential(r); ok && visibleASCII(token) {
		if caller, found := g.o.Tokens.lookup(token); found {
			c.caller = caller
			c.ri.caller = caller.ID
			return true
		}
	}
	writeProblem(w, c.surface, &answer.Problem{Kind: answer.Unauthorized,
		Message: "missing or unknown API key: send it as your API's clients do (Authorization: Bearer <token>) with a token of the gateway's tokens file"})
	return false
}

// acquire takes one of the caller's in-flight places; release gives it
// back.
func (g *Gateway) acquire(c Caller) (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.MaxInFlight > 0 && g.inFlight[c.ID] >= c.MaxInFlight {
		return nil, false
	}
	g.inFlight[c.ID]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.inFlight[c.ID]--; g.inFlight[c.ID] <= 0 {
				delete(g.inFlight, c.ID)
			}
		})
	}, true
}

// visibleASCII reports a token of one or more visible ASCII characters:
// anything else (a no-break space, a control) is no token's.
func visibleASCII(token string) bool {
	if token == "" {
		return false
	}
	for i := 0; i < len(token); i++ {
		if token[i] < 0x21 || token[i] > 0x7e {
			return false
		}
	}
	return true
}

// localOnly is the door of a gateway without tokens, whose every caller
// is an operator: it answers what a program on this host sends, and
// refuses what a web page in a browser can make: a Host that is not
// loopback (a page whose name was rebound to 127.0.0.1 names its own), an
// Origin (a browser names the page's), a body that is not JSON (a form's,
// or a text/plain POST, which need no preflight).
func localOnly(r *http.Request) *answer.Problem {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip := net.ParseIP(host); !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
		return &answer.Problem{Kind: answer.Forbidden, Code: "non_loopback_host",
			Message: "a gateway without a tokens file answers only requests to a loopback address (Host 127.0.0.1, ::1 or localhost); give it --tokens to serve others"}
	}
	if r.Header.Get("Origin") != "" {
		return &answer.Problem{Kind: answer.Forbidden, Code: "cross_origin",
			Message: "a gateway without a tokens file answers no request from a web page (Origin); give it --tokens to serve one"}
	}
	if r.Method == http.MethodPost && (r.ContentLength != 0) {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			return &answer.Problem{Kind: answer.UnsupportedMediaType,
				Message: "a request body must be JSON: send Content-Type: application/json"}
		}
	}
	return nil
}
