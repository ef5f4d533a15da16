package worker

import (
	"strings"
	"testing"
)

// The metrics address also served generated text (/v1/streams/), and the
// compose file bound it to 0.0.0.0 without a token: anyone on the network
// could read any action's answer by its id. The stream endpoint has its
// own address, and one beyond loopback needs a token.
func TestStreamEndpointBeyondLoopbackNeedsAToken(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"", "", true},
		{"127.0.0.1:9091", "", true},
		{"[::1]:9091", "", true},
		{"localhost:9091", "", true},
		{"0.0.0.0:9091", "", false},
		{":9091", "", false},
		{"10.1.2.3:9091", "", false},
		{"0.0.0.0:9091", "s3cret", true},
		{"not-an-address", "", false},
	} {
		err := checkStreamAddr(tc.addr, tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("addr %q token %v: err %v", tc.addr, tc.token != "", err)
		}
		if err != nil && tc.token == "" && strings.Contains(tc.addr, ":") && tc.addr != "not-an-address" && !strings.Contains(err.Error(), "token") {
			t.Errorf("the error does not say how to fix it: %v", err)
		}
	}
	// New refuses before it touches the Temporal client.
	if _, err := New(nil, Options{StreamAddr: "0.0.0.0:9091"}); err == nil || !strings.Contains(err.Error(), "stream token") {
		t.Fatalf("New: %v", err)
	}
}
