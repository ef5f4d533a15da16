package responses

import (
	"testing"

	"github.com/durallm/durallm/gateway/answer/answertest"
)

// No answer to a request whose action may have run is one that a common
// client sends again by default: the Responses surface answers problems as
// chat does (openaiwire), with a 403 and x-should-retry: false.
func TestNoAnswerThatMayHaveRunIsRetriedByAClientsDefaultPolicy(t *testing.T) {
	answertest.NoResendOfWhatMayHaveRun(t, Surface{}, answertest.Clients...)
}
