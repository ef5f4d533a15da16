package chat

import (
	"testing"

	"github.com/durallm/durallm/gateway/answer/answertest"
)

// No answer to a request whose action may have run is one that a common
// client sends again by default: without a key, a resend runs the model
// again. Only the refusals that started nothing invite one, to the
// clients that read x-should-retry.
func TestNoAnswerThatMayHaveRunIsRetriedByAClientsDefaultPolicy(t *testing.T) {
	answertest.NoResendOfWhatMayHaveRun(t, Surface{}, answertest.Clients...)
}
