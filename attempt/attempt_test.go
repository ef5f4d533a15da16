package attempt

import "testing"

func TestStreamIdentity(t *testing.T) {
	id := StreamIdentity("123@host@durallm", "http://10.0.0.7:9092")
	if id != "123@host@durallm@durallm-stream=http://10.0.0.7:9092" || StreamURLOf(id) != "http://10.0.0.7:9092" {
		t.Fatalf("%q → %q", id, StreamURLOf(id))
	}
	if StreamIdentity("123@host@q", "") != "123@host@q" {
		t.Fatal("an empty URL changes the identity")
	}
	for _, other := range []string{"", "123@host@durallm", "someone's@own identity"} {
		if u := StreamURLOf(other); u != "" {
			t.Fatalf("StreamURLOf(%q) = %q", other, u)
		}
	}
}
