package recovery

import (
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
		ok     bool
	}{
		{"absent", http.Header{}, 0, false},
		{"seconds", http.Header{"Retry-After": {"2"}}, 2 * time.Second, true},
		{"zero seconds means now", http.Header{"Retry-After": {"0"}}, 0, true},
		{"seconds with spaces", http.Header{"Retry-After": {" 7 "}}, 7 * time.Second, true},
		{"HTTP-date in the future", http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, 90 * time.Second, true},
		{"HTTP-date in the past means now", http.Header{"Retry-After": {now.Add(-time.Hour).Format(http.TimeFormat)}}, 0, true},
		{"RFC 850 date", http.Header{"Retry-After": {"Monday, 30-Nov-26 12:00:30 GMT"}}, 30 * time.Second, true},
		{"retry-after-ms", http.Header{"Retry-After-Ms": {"1500"}}, 1500 * time.Millisecond, true},
		{"fractional retry-after-ms", http.Header{"Retry-After-Ms": {"12.5"}}, 12500 * time.Microsecond, true},
		{"retry-after-ms wins over Retry-After", http.Header{"Retry-After-Ms": {"250"}, "Retry-After": {"9"}}, 250 * time.Millisecond, true},
		{"garbage retry-after-ms falls back to Retry-After", http.Header{"Retry-After-Ms": {"soon"}, "Retry-After": {"3"}}, 3 * time.Second, true},
		{"negative seconds: no hint", http.Header{"Retry-After": {"-5"}}, 0, false},
		{"negative ms: no hint", http.Header{"Retry-After-Ms": {"-100"}}, 0, false},
		{"NaN ms: no hint", http.Header{"Retry-After-Ms": {"NaN"}}, 0, false},
		{"infinite ms: no hint", http.Header{"Retry-After-Ms": {"+Inf"}}, 0, false},
		{"garbage: no hint", http.Header{"Retry-After": {"later please"}}, 0, false},
		{"decimal seconds are not delta-seconds", http.Header{"Retry-After": {"1.5"}}, 0, false},
		{"huge seconds clamp", http.Header{"Retry-After": {"99999999999999999999999999"}}, MaxRetryAfter, true},
		{"huge ms clamp", http.Header{"Retry-After-Ms": {"1e300"}}, MaxRetryAfter, true},
		{"far-future date clamps", http.Header{"Retry-After": {"Fri, 31 Dec 9999 23:59:59 GMT"}}, MaxRetryAfter, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tt.header, now)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("ParseRetryAfter = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"2", "-1", "1.5", "NaN", "1e309", "Wed, 21 Oct 2015 07:28:00 GMT", "", "  ", "99999999999999999999"} {
		f.Add(s, s)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ra, ms string) {
		h := http.Header{}
		h.Set("Retry-After", ra)
		h.Set("retry-after-ms", ms)
		d, ok := ParseRetryAfter(h, now)
		if d < 0 || d > MaxRetryAfter {
			t.Fatalf("ParseRetryAfter(%q, %q) = %v out of [0, %v]", ra, ms, d, MaxRetryAfter)
		}
		if !ok && d != 0 {
			t.Fatalf("no hint but d = %v", d)
		}
	})
}
