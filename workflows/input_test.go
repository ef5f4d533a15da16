package workflows

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// A TypeScript or Python app starting LLMAction by name had to write
// "deadline": 120000000000. Durations are read as nanoseconds or as Go
// duration strings, and written as nanoseconds, as before.
func TestActionInputAcceptsDurationStrings(t *testing.T) {
	const in = `{"request":{"messages":[{"role":"user","content":"hi"}]},"routes":["a"],
		"deadline":"2m","attempt_timeout":30000000000,"queue_timeout":"10s","reconcile_timeout":"24h",
		"backoff":{"initial":"250ms","max":"5s"},"max_attempts":3}`
	var got ActionInput
	if err := json.Unmarshal([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	if got.Deadline != 2*time.Minute || got.AttemptTimeout != 30*time.Second || got.QueueTimeout != 10*time.Second ||
		got.ReconcileTimeout != 24*time.Hour || got.Backoff.Initial != 250*time.Millisecond || got.Backoff.Max != 5*time.Second ||
		got.MaxAttempts != 3 || len(got.Routes) != 1 || len(got.Request.Messages) != 1 {
		t.Fatalf("decoded %+v", got)
	}
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	_ = json.Unmarshal(b, &raw)
	if raw["deadline"] != float64(2*time.Minute) {
		t.Fatalf("deadline written as %v, want nanoseconds", raw["deadline"])
	}
	var bad ActionInput
	if err := json.Unmarshal([]byte(`{"deadline":"two minutes"}`), &bad); !errors.Is(err, ErrBadDuration) {
		t.Fatalf("err %v, want ErrBadDuration", err)
	}
}
