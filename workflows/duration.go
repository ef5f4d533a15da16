package workflows

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// ErrBadDuration is returned for a JSON duration that is neither a number
// of nanoseconds nor a Go duration string.
var ErrBadDuration = errors.New("not a duration: want a number of nanoseconds or a Go duration string such as \"2m\" or \"1h30m\"")

// DurationJSON is a time.Duration read from JSON as a number of
// nanoseconds (what Go's encoding/json writes for a time.Duration) or as a
// Go duration string ("250ms", "2m"), so callers in other languages need
// not count nanoseconds. It writes a number, as a time.Duration does, so
// recorded histories read the same.
type DurationJSON time.Duration

// UnmarshalJSON accepts a number of nanoseconds, a duration string or null
// (zero).
func (d *DurationJSON) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case string(b) == "null":
		*d = 0
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("%w (%v)", ErrBadDuration, err)
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q: %w", s, ErrBadDuration)
		}
		*d = DurationJSON(v)
		return nil
	}
	// Integral nanoseconds; a float is accepted when it is integral (some
	// JSON encoders write 1.2e+11).
	if v, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		*d = DurationJSON(v)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > math.MaxInt64 {
		return fmt.Errorf("%s: %w", b, ErrBadDuration)
	}
	*d = DurationJSON(int64(f))
	return nil
}

// MarshalJSON writes nanoseconds, as encoding/json does for a
// time.Duration.
func (d DurationJSON) MarshalJSON() ([]byte, error) {
	return strconv.AppendInt(nil, int64(d), 10), nil
}

// UnmarshalJSON reads Initial and Max as DurationJSON values.
func (b *Backoff) UnmarshalJSON(data []byte) error {
	var w struct {
		Initial DurationJSON `json:"initial"`
		Max     DurationJSON `json:"max"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("backoff: %w", err)
	}
	b.Initial, b.Max = time.Duration(w.Initial), time.Duration(w.Max)
	return nil
}
