package gateway

import (
	"net/http"
	"sync"

	"github.com/durallm/durallm/gateway/answer"
)

// authenticate finds the caller of the request's token, read as the
// call's surface reads it; without tokens every request is the anonymous
// operator.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request, c *call) bool {
	if g.o.Tokens == nil {
		c.caller = anonymous
		c.ri.caller = anonymous.ID
		return true
	}
	if token, ok := c.surface.Credential(r); ok {
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
