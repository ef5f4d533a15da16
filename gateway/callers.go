package gateway

import (
	"net/http"
	"strings"
	"sync"
)

// authenticate finds the caller of the request's bearer token; without
// tokens every request is the anonymous operator.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request) (Caller, bool) {
	if g.o.Tokens == nil {
		return anonymous, true
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		if c, found := g.o.Tokens.lookup(strings.TrimSpace(token)); found {
			return c, true
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="durallm gateway"`)
	writeError(w, &apiError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: codeInvalidAPIKey,
		Message: "missing or unknown API key: send Authorization: Bearer <token> with a token of the gateway's tokens file"})
	return Caller{}, false
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
