package recovery

// Headers every attempt carries. The provider sees both; the engine uses
// HeaderAttemptID to find the attempt's stream on the wire.
const (
	// HeaderIdempotencyKey carries the action's idempotency key, identical
	// on every attempt of one action. Providers that honour it deduplicate.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderAttemptID carries the per-attempt id, unique per attempt.
	HeaderAttemptID = "X-Durallm-Attempt"
)
