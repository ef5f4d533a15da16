package responses

import (
	"encoding/json"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// The Responses wire shapes the gateway writes, members in the order
// OpenAI sends them. They are written by hand: openai-go's responses
// package types (Response, ResponseOutputText, ...) are decoders, whose
// zero values marshal as members OpenAI never sends (annotations: null, a
// union as an object of all its variants' fields), and its param types
// describe requests, not answers (TestWhyAnswersAreWrittenWithTheirOwnWireStructs).
// The SDK is the judge instead: every shape here is read back through its
// types in the tests.
type (
	wireResponse struct {
		ID                string          `json:"id"`
		Object            string          `json:"object"`
		CreatedAt         int64           `json:"created_at"`
		Status            string          `json:"status"`
		Error             *wireError      `json:"error"`
		IncompleteDetails *wireIncomplete `json:"incomplete_details"`
		Model             string          `json:"model"`
		Output            []any           `json:"output"`
		// Usage is null when the provider reported none: 0/0 would
		// read as a count.
		Usage *wireUsage `json:"usage"`
	}
	wireError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	wireIncomplete struct {
		Reason string `json:"reason"`
	}
	wireUsage struct {
		InputTokens         int             `json:"input_tokens"`
		InputTokensDetails  cachedTokens    `json:"input_tokens_details"`
		OutputTokens        int             `json:"output_tokens"`
		OutputTokensDetails reasoningTokens `json:"output_tokens_details"`
		TotalTokens         int             `json:"total_tokens"`
	}
	cachedTokens struct {
		CachedTokens int `json:"cached_tokens"`
	}
	reasoningTokens struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	}
	// wireMessage is a message output item.
	wireMessage struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Status  string `json:"status"`
		Content []any  `json:"content"`
		Role    string `json:"role"`
	}
	// wireText is an output_text part: annotations is always an array,
	// which the AI SDK requires of it.
	wireText struct {
		Type        string     `json:"type"`
		Annotations []struct{} `json:"annotations"`
		Logprobs    []struct{} `json:"logprobs"`
		Text        string     `json:"text"`
	}
	wireRefusal struct {
		Type    string `json:"type"`
		Refusal string `json:"refusal"`
	}
	// wireCall is a function_call output item.
	wireCall struct {
		ID        string `json:"id"`
		Type      string `json:"type"`
		Status    string `json:"status"`
		Arguments string `json:"arguments"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
	}
)

// The statuses of a response and of its items.
const (
	statusInProgress = "in_progress"
	statusCompleted  = "completed"
	statusIncomplete = "incomplete"
	statusFailed     = "failed"
)

func usageOf(u providers.Usage) *wireUsage {
	if u == (providers.Usage{}) {
		return nil
	}
	return &wireUsage{InputTokens: u.PromptTokens, InputTokensDetails: cachedTokens{u.CachedTokens},
		OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
}

func newText(s string) *wireText {
	return &wireText{Type: "output_text", Annotations: []struct{}{}, Logprobs: []struct{}{}, Text: s}
}

// RenderResponse renders an answer as a response object (object
// "response"): its id is the action id, its created_at and model those the
// action was started with. Its output is what a stream of the same answer
// builds (the encoder is fed the whole answer), so an answer read as JSON
// and the one a stream ends with are the same object: a message item
// with the text (an output_text part) and the refusal (a refusal part),
// then a function_call item per tool call. A partial answer is status
// incomplete with incomplete_details.reason max_output_tokens (it was
// cut), and the gateway marks it x-durallm-incomplete.
func RenderResponse(who answer.Identity, r *providers.Response) []byte {
	if r == nil {
		r = &providers.Response{}
	}
	e := newEncoder(who, true)
	for _, d := range deltasOf(r) {
		e.Delta(d)
	}
	b, _ := json.Marshal(e.final(r)) // only marshallable values
	return append(b, '\n')
}

// deltasOf is a whole answer as the deltas a stream of it carries.
func deltasOf(r *providers.Response) []answer.Delta {
	var out []answer.Delta
	if r.Text != "" {
		out = append(out, answer.Delta{Kind: answer.Text, Text: r.Text})
	}
	if r.Refusal != "" {
		out = append(out, answer.Delta{Kind: answer.Refusal, Text: r.Refusal})
	}
	for _, c := range exchange.WholeChunk(*r).ToolCalls {
		out = append(out, answer.Delta{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: c.Index, ID: c.ID, Type: c.Type, Name: c.Name, Arguments: c.Arguments}})
	}
	return out
}
