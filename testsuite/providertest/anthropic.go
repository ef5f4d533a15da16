package providertest

import (
	"encoding/json"
	"strings"
)

// AnthropicEvents renders Messages stream events (each a JSON object with
// its "type") as Anthropic streams them, each with its "event:" line named
// by its type: the body of a [Status] behaviour that plays an Anthropic
// route, whose shape the provider does not speak itself.
func AnthropicEvents(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		var typ struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal([]byte(e), &typ)
		b.WriteString("event: " + typ.Type + "\ndata: " + e + "\n\n")
	}
	return b.String()
}
