package providertest_test

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/durallm/durallm/testsuite/providertest"
	"golang.org/x/net/http2"
)

// A GOAWAY refuses the first send of a request; Go's HTTP/2 transport
// silently re-sends it on a new connection. The client sees one success,
// while the provider's records show two sends and one execution.
func Example() {
	p, err := providertest.NewProvider()
	if err != nil {
		panic(err)
	}
	defer p.Close()
	p.Push(providertest.GoAwayAbove(http2.ErrCodeNo), providertest.Answer("hello"))

	tr := &http2.Transport{TLSClientConfig: p.ClientTLSConfig()}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, p.URL()+"/v1/chat/completions",
		strings.NewReader(`{"model":"any","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		panic(err)
	}
	req.Header.Set("X-Durallm-Attempt", "attempt-1")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()

	fmt.Println("status:", resp.StatusCode)
	fmt.Println("sends seen by provider:", len(p.Received()))
	fmt.Println("executions:", p.AttemptExecutions("attempt-1"))
	// Output:
	// status: 200
	// sends seen by provider: 2
	// executions: 1
}
