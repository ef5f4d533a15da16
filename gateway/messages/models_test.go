package messages

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
)

func TestAPIKey(t *testing.T) {
	for _, tc := range []struct {
		h    http.Header
		key  string
		isOK bool
	}{
		{http.Header{"X-Api-Key": {"k1"}}, "k1", true},
		{http.Header{"Authorization": {"Bearer k2"}}, "k2", true},
		{http.Header{"Authorization": {"bearer k3"}}, "k3", true},
		{http.Header{"X-Api-Key": {"k1"}, "Authorization": {"Bearer k2"}}, "k1", true},
		{http.Header{"Authorization": {"Basic abc"}}, "", false},
		{http.Header{"Authorization": {"Bearer "}}, "", false},
		{http.Header{}, "", false},
	} {
		if k, ok := APIKey(tc.h); k != tc.key || ok != tc.isOK {
			t.Errorf("%v: %q %v", tc.h, k, ok)
		}
	}
	if !WantsAnthropic(http.Header{"Anthropic-Version": {"2026-10-21"}}) || WantsAnthropic(http.Header{}) {
		t.Error("WantsAnthropic")
	}
}

func TestModelsJSON(t *testing.T) {
	m := `{"type":"model","id":"%s","display_name":"%s","created_at":"1970-01-01T00:00:00Z","lifecycle":"active","deprecated_at":null,"retires_at":null}`
	one := func(id string) string { return fmt.Sprintf(m, id, id) }
	for _, tc := range []struct {
		ids  []string
		want string
	}{
		{[]string{"a", "b"}, `{"data":[` + one("a") + `,` + one("b") + `],"has_more":false,"first_id":"a","last_id":"b"}`},
		{nil, `{"data":[],"has_more":false,"first_id":null,"last_id":null}`},
	} {
		if got := string(ModelsJSON(tc.ids)); got != tc.want+"\n" {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
	if got := string(ModelJSON("a")); got != one("a")+"\n" {
		t.Errorf("got %s", got)
	}
}

// count_tokens and batches are refused with a 501 that says why, not
// retried.
func TestUnservedRoutes(t *testing.T) {
	n := 0
	for _, rt := range (Surface{}).Routes() {
		if rt.Op != answer.Unserved {
			continue
		}
		n++
		r := render(*rt.Problem)
		if r.Status != http.StatusNotImplemented || r.Header.Get("X-Should-Retry") != "false" || !strings.Contains(string(r.Body), rt.Path+" is not served") {
			t.Fatalf("%s: %d %v %s", rt.Path, r.Status, r.Header, r.Body)
		}
	}
	if n != 2 {
		t.Fatalf("%d unserved routes", n)
	}
}
