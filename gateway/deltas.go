package gateway

import (
	"encoding/json"
	"strings"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
)

// answerDeltas are the deltas an answer streams as, rebuilt from the
// response alone: the pieces it was handed on in (providers.Pieces, as
// the worker's hub numbered them), then whatever the pieces did not carry
// (a provider that answered a stream with a whole body, an answer nobody
// streamed, a verdict's text) as one delta of text, one of refusal and one
// per tool call. Every gateway rebuilds the same deltas from the same
// response, so a stream encoder fed them numbers its events alike
// wherever a stream is served or resumed.
func answerDeltas(r *providers.Response) []answer.Delta {
	calls := toolCallsOf(r.ToolCalls)
	args := make([]int, len(calls)) // the arguments' bytes handed on
	seen := make([]bool, len(calls))
	var text, refusal int
	var out []answer.Delta
	pieces, err := r.Pieces.Parse()
	if err != nil {
		// A record this gateway cannot read: the answer as if it had not
		// streamed.
		pieces = nil
	}
	for _, p := range pieces {
		switch p.Kind {
		case providers.PieceText:
			end := min(text+p.Len, len(r.Text))
			out = append(out, answer.Delta{Kind: answer.Text, Text: r.Text[text:end]})
			text = end
		case providers.PieceRefusal:
			end := min(refusal+p.Len, len(r.Refusal))
			out = append(out, answer.Delta{Kind: answer.Refusal, Text: r.Refusal[refusal:end]})
			refusal = end
		case providers.PieceToolCall:
			if p.Call >= len(calls) {
				continue
			}
			c := calls[p.Call]
			d := answer.ToolCallDelta{Index: p.Call}
			if p.ID {
				d.ID = c.ID
			}
			if p.Type {
				d.Type = c.Type
			}
			if p.Name {
				d.Name = c.Function.Name
			}
			end := min(args[p.Call]+p.Len, len(c.Function.Arguments))
			d.Arguments = c.Function.Arguments[args[p.Call]:end]
			args[p.Call], seen[p.Call] = end, true
			out = append(out, answer.Delta{Kind: answer.ToolCall, ToolCall: d})
		}
	}
	if text < len(r.Text) {
		out = append(out, answer.Delta{Kind: answer.Text, Text: r.Text[text:]})
	}
	if refusal < len(r.Refusal) {
		out = append(out, answer.Delta{Kind: answer.Refusal, Text: r.Refusal[refusal:]})
	}
	for i, c := range calls {
		switch {
		case !seen[i]:
			out = append(out, answer.Delta{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{
				Index: i, ID: c.ID, Type: c.Type, Name: c.Function.Name, Arguments: c.Function.Arguments}})
		case args[i] < len(c.Function.Arguments):
			out = append(out, answer.Delta{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: i, Arguments: c.Function.Arguments[args[i]:]}})
		}
	}
	return out
}

// toolCall is one tool call of a response, in OpenAI's shape.
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func toolCallsOf(raw json.RawMessage) []toolCall {
	var calls []toolCall
	if len(raw) > 0 && json.Unmarshal(raw, &calls) != nil {
		return nil
	}
	return calls
}

// fedDeltas is what a stream's encoder was fed so far.
type fedDeltas struct {
	n             int
	text, refusal strings.Builder
	toolCalls     int
}

func (f *fedDeltas) any() bool { return f.n > 0 }

func (f *fedDeltas) add(d answer.Delta) {
	f.n++
	switch d.Kind {
	case answer.Text:
		f.text.WriteString(d.Text)
	case answer.Refusal:
		f.refusal.WriteString(d.Text)
	case answer.ToolCall:
		f.toolCalls = max(f.toolCalls, d.ToolCall.Index+1)
	}
}

// rest is what the answer r has that the deltas fed did not carry: the
// deltas after the ones fed, all of them rebuilt from r. The fed ones came
// live from the same hub that recorded r's pieces, so they are the first
// of them. An answer a worker streamed without recording its pieces (an
// earlier version) is completed by content instead: the text and refusal
// past what was fed, and the tool calls when none were.
func (f *fedDeltas) rest(r *providers.Response) []answer.Delta {
	if r.Pieces != "" || f.n == 0 {
		all := answerDeltas(r)
		if f.n >= len(all) {
			return nil
		}
		return all[f.n:]
	}
	var out []answer.Delta
	if sent := f.text.String(); strings.HasPrefix(r.Text, sent) && len(r.Text) > len(sent) {
		out = append(out, answer.Delta{Kind: answer.Text, Text: r.Text[len(sent):]})
	}
	if sent := f.refusal.String(); strings.HasPrefix(r.Refusal, sent) && len(r.Refusal) > len(sent) {
		out = append(out, answer.Delta{Kind: answer.Refusal, Text: r.Refusal[len(sent):]})
	}
	if f.toolCalls == 0 {
		out = append(out, answerDeltas(&providers.Response{ToolCalls: r.ToolCalls})...)
	}
	return out
}
