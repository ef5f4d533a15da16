package recovery

import "net/http"

// Headers every attempt carries. The provider sees both; the engine uses
// HeaderAttemptID to find the attempt's stream on the wire.
const (
	// HeaderIdempotencyKey carries the action's idempotency key, identical
	// on every attempt of one action. Providers that honour it deduplicate.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderAttemptID carries the per-attempt id, unique per attempt.
	HeaderAttemptID = "X-Durallm-Attempt"
)

// sendHeader returns the header an attempt sends: a copy of h (which is
// not modified) with HeaderAttemptID set to attemptID and, when key is
// not empty and h carries no Idempotency-Key value, HeaderIdempotencyKey
// set to key. That is h.Clone() followed by Set, built with room for the
// two values: Clone sizes the map and the shared values array for h
// alone, so each Set then allocated again (a []string, and a bigger map
// when h's was full), on every request.
func sendHeader(h http.Header, attemptID, key string) http.Header {
	nv := 2
	for _, vv := range h {
		nv += len(vv)
	}
	sv := make([]string, nv) // shared backing array, as in Clone
	out := make(http.Header, len(h)+2)
	for k, vv := range h {
		if vv == nil {
			// Preserved as Clone does.
			out[k] = nil
			continue
		}
		n := copy(sv, vv)
		out[k] = sv[:n:n]
		sv = sv[n:]
	}
	// Both names are canonical, so indexing is what Set and Get do.
	sv[0] = attemptID
	out[HeaderAttemptID] = sv[0:1:1]
	if vv := out[HeaderIdempotencyKey]; key != "" && (len(vv) == 0 || vv[0] == "") {
		sv[1] = key
		out[HeaderIdempotencyKey] = sv[1:2:2]
	}
	return out
}
