package e2e_test

import (
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/durallm/durallm/testsuite/providertest"
)

// With the worker in another process's place (its own Temporal client,
// no shared hub), the gateway finds the attempt's stream through its
// first heartbeat and streams it live: the first chunk arrives while the
// provider still holds the rest.
func TestGatewayStreamsFromAWorkerElsewhere(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.remote = true })
	if s.w.StreamURL() == "" {
		t.Fatal("the worker advertises no stream URL")
	}
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("first and the rest").MidStreamWaitFor(gate))
	params := chatParams("demo", "x")
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := s.client(tokenA).Chat.Completions.NewStreaming(testCtx(t), params)
	var acc openai.ChatCompletionAccumulator
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	acc.AddChunk(stream.Current())
	if got := acc.Choices[0].Message.Content; got != "first" {
		t.Fatalf("first chunk %q, want the provider's first word while it holds the rest", got)
	}
	close(gate)
	var last openai.ChatCompletionChunk
	for stream.Next() {
		last = stream.Current()
		acc.AddChunk(last)
	}
	if stream.Err() != nil || acc.Choices[0].Message.Content != "first and the rest" || last.Usage.TotalTokens == 0 {
		t.Fatalf("%q usage %+v %v", acc.Choices[0].Message.Content, last.Usage, stream.Err())
	}
}

// A keyed retry that attaches to an action streaming elsewhere reads the
// worker's log from its first event.
func TestGatewayReattachToAStreamElsewhere(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.remote = true })
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("one two three").MidStreamWaitFor(gate))
	_, drop, lr := openStreamRaw(t, s, "remote-1", nil)
	if _, data, err := lr.next(); err != nil || contentOf(t, data) != "one" {
		t.Fatalf("first chunk %q %v", data, err)
	}
	drop()
	stream := s.client(tokenA, option.WithHeader("Idempotency-Key", "remote-1")).Chat.Completions.NewStreaming(testCtx(t), chatParams("demo", "tell a story"))
	close(gate)
	var text strings.Builder
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if stream.Err() != nil || text.String() != "one two three" || s.executed() != 1 {
		t.Fatalf("%q %v executed %d", text.String(), stream.Err(), s.executed())
	}
}
