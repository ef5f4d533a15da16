package providers

import "slices"

// Capabilities is what a route offers, or what an action needs of every
// route it uses (docs/contract.md section 4.6). The zero value offers,
// or needs, nothing.
type Capabilities struct {
	// Tools: function/tool calling.
	Tools bool `json:"tools,omitempty"`
	// StructuredOutput: response_format with a JSON schema.
	StructuredOutput bool `json:"structured_output,omitempty"`
	// Streaming: server-sent-event streams.
	Streaming bool `json:"streaming,omitempty"`
	// Vision: image content parts.
	Vision bool `json:"vision,omitempty"`
	// ContextTokens is the context window. For a route, 0 means unknown
	// or unbounded (never a reason to skip it); for a need, 0 means no
	// requirement.
	ContextTokens int `json:"context_tokens,omitempty"`
	// DataTags are data-handling promises such as "eu" or "no-retention".
	// A need lists tags every route must carry. Compared exactly.
	DataTags []string `json:"data_tags,omitempty"`
}

// Union returns the needs of both c and o: every capability either asks
// for, the larger context, and the tags of both (c's first, no repeats).
// It is deterministic, so workflow code may call it.
func (c Capabilities) Union(o Capabilities) Capabilities {
	u := Capabilities{
		Tools:            c.Tools || o.Tools,
		StructuredOutput: c.StructuredOutput || o.StructuredOutput,
		Streaming:        c.Streaming || o.Streaming,
		Vision:           c.Vision || o.Vision,
		ContextTokens:    max(c.ContextTokens, o.ContextTokens),
	}
	for _, t := range append(append([]string(nil), c.DataTags...), o.DataTags...) {
		if !slices.Contains(u.DataTags, t) {
			u.DataTags = append(u.DataTags, t)
		}
	}
	return u
}

// Satisfies reports whether have offers everything need asks for, and
// names each gap, in a fixed order: "tools", "structured_output",
// "streaming", "vision", "context_tokens", then "data_tag:<tag>" per
// missing tag in need's order. It is deterministic, so workflow code may
// call it.
func (have Capabilities) Satisfies(need Capabilities) (ok bool, missing []string) {
	if need.Tools && !have.Tools {
		missing = append(missing, "tools")
	}
	if need.StructuredOutput && !have.StructuredOutput {
		missing = append(missing, "structured_output")
	}
	if need.Streaming && !have.Streaming {
		missing = append(missing, "streaming")
	}
	if need.Vision && !have.Vision {
		missing = append(missing, "vision")
	}
	if need.ContextTokens > 0 && have.ContextTokens > 0 && need.ContextTokens > have.ContextTokens {
		missing = append(missing, "context_tokens")
	}
	for _, tag := range need.DataTags {
		found := false
		for _, t := range have.DataTags {
			if t == tag {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, "data_tag:"+tag)
		}
	}
	return len(missing) == 0, missing
}
