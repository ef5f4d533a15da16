package e2e_test

import (
	"testing"
	"time"

	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// A hang-up that the gateway sees as a failed write, not as the request's
// end, is a disconnect all the same: the keyless action is canceled
// (client_disconnect).
func TestAHangUpSeenAsAFailedWriteCancelsTheAction(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.writeTimeout = 500 * time.Millisecond; o.smallBuffers = true })
	s.p.Push(providertest.StreamStall(3000))
	id := stalledReader(t, s, tokenA, nil)
	res := s.result(id)
	if res.State != workflows.StateCanceled || res.Origin != workflows.OriginClientDisconnect {
		t.Fatalf("the action of a caller whose writes failed ended %s (%s)", res.State, res.Origin)
	}
}
