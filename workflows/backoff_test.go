package workflows

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	long := time.Hour
	tests := []struct {
		name       string
		retry      int
		jitter     float64
		retryAfter time.Duration
		remaining  time.Duration
		want       time.Duration
		ok         bool
	}{
		{"first retry, top of the window", 1, 0.999999, 0, long, 99999900 * time.Nanosecond, true},
		{"first retry, half jitter", 1, 0.5, 0, long, 50 * time.Millisecond, true},
		{"window doubles", 3, 0.5, 0, long, 200 * time.Millisecond, true},
		{"window is capped", 20, 0.5, 0, long, 500 * time.Millisecond, true},
		{"absurd retry count does not overflow", 1 << 30, 0.5, 0, long, 500 * time.Millisecond, true},
		{"zero jitter waits nothing", 4, 0, 0, long, 0, true},
		{"jitter above 1 is clamped", 1, 7, 0, long, 99999900 * time.Nanosecond, true},
		{"negative jitter is clamped", 1, -3, 0, long, 0, true},
		{"Retry-After raises the wait", 1, 0.5, 3 * time.Second, long, 3 * time.Second, true},
		{"Retry-After below the jitter does not lower it", 3, 0.5, 10 * time.Millisecond, long, 200 * time.Millisecond, true},
		{"never past the deadline", 1, 0.5, 3 * time.Second, 2 * time.Second, 2 * time.Second, false},
		{"deadline already passed", 1, 0.5, 0, -time.Second, 0, false},
		{"wait that lands exactly on the deadline is refused", 1, 0.5, time.Second, time.Second, time.Second, false},
		{"retry 0 behaves like the first", 0, 0.5, 0, long, 50 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := b.Delay(tt.retry, tt.jitter, tt.retryAfter, tt.remaining)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("Delay = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestBackoffZeroValueUsesDefaults(t *testing.T) {
	d, ok := Backoff{}.Delay(1, 0.5, 0, time.Hour)
	if !ok || d != defaultBackoffInitial/2 {
		t.Fatalf("zero Backoff first delay = %v, %v; want %v", d, ok, defaultBackoffInitial/2)
	}
	d, _ = Backoff{}.Delay(100, 0.5, 0, time.Hour)
	if d != defaultBackoffMax/2 {
		t.Fatalf("zero Backoff capped delay = %v; want %v", d, defaultBackoffMax/2)
	}
}

// A JSON input from another language says "2m", not 120000000000.
func TestDurationJSONAcceptsNumbersAndStrings(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{`120000000000`, 2 * time.Minute, false},
		{`"2m"`, 2 * time.Minute, false},
		{`"1h30m"`, 90 * time.Minute, false},
		{`"250ms"`, 250 * time.Millisecond, false},
		{`1.2e+11`, 2 * time.Minute, false},
		{`null`, 0, false},
		{`"2 minutes"`, 0, true},
		{`"120"`, 0, true},
		{`1.5`, 0, true},
		{`true`, 0, true},
	} {
		var d DurationJSON
		err := json.Unmarshal([]byte(tc.in), &d)
		if tc.bad {
			if !errors.Is(err, ErrBadDuration) {
				t.Errorf("%s: err %v, want ErrBadDuration", tc.in, err)
			}
			continue
		}
		if err != nil || time.Duration(d) != tc.want {
			t.Errorf("%s: %v %v, want %v", tc.in, time.Duration(d), err, tc.want)
		}
	}
	var b Backoff
	if err := json.Unmarshal([]byte(`{"initial":"100ms","max":5000000000}`), &b); err != nil || b.Initial != 100*time.Millisecond || b.Max != 5*time.Second {
		t.Fatalf("backoff %+v %v", b, err)
	}
	out, _ := json.Marshal(Backoff{Initial: time.Second})
	if string(out) != `{"initial":1000000000}` {
		t.Fatalf("backoff marshals as %s", out)
	}
}
