package providers

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestPromptTokenBound(t *testing.T) {
	text := func(role, s string) Message { return TextMessage(role, s) }
	parts := func(role string, p ...string) Message {
		return Message{Role: role, Content: json.RawMessage("[" + strings.Join(p, ",") + "]")}
	}
	image := `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 40000) + `"}}`
	hello := `{"type":"text","text":"hello"}`
	for _, tt := range []struct {
		name        string
		r           Request
		imageTokens int
		want        int
		ok          bool
	}{
		{"one text message: its JSON bytes, the role and the overheads", Request{Messages: []Message{text("user", "hello")}}, 0,
			RequestOverheadTokens + MessageOverheadTokens + len("user") + len(`"hello"`), true},
		{"multi-byte text counts its UTF-8 bytes", Request{Messages: []Message{text("user", "héllo 世界")}}, 0,
			RequestOverheadTokens + MessageOverheadTokens + len("user") + len(`"héllo 世界"`), true},
		{"tools add their JSON and the tool-use overhead", Request{Messages: []Message{text("user", "x")}, Tools: []json.RawMessage{json.RawMessage(`{"type":"function"}`)}}, 0,
			RequestOverheadTokens + ToolsOverheadTokens + len(`{"type":"function"}`) + MessageOverheadTokens + len("user") + len(`"x"`), true},
		{"an image counts the default bound, not its base64 bytes", Request{Messages: []Message{parts("user", hello, image)}}, 0,
			RequestOverheadTokens + MessageOverheadTokens + len("user") + 2 + 2 + len(hello) + DefaultImageTokens, true},
		{"an image counts the route's own bound", Request{Messages: []Message{parts("user", image)}}, 50000,
			RequestOverheadTokens + MessageOverheadTokens + len("user") + 2 + 1 + 50000, true},
		{"a file part cannot be bounded", Request{Messages: []Message{parts("user", `{"type":"file","file":{"file_id":"file-1"}}`)}}, 0,
			RequestOverheadTokens + MessageOverheadTokens + len("user") + 3, false},
		{"tool calls and their answers count", Request{Messages: []Message{{Role: "assistant", ToolCalls: json.RawMessage(`[{"id":"c1"}]`)}, {Role: "tool", ToolCallID: "c1", Content: json.RawMessage(`"42"`)}}}, 0,
			RequestOverheadTokens + 2*MessageOverheadTokens + len("assistant") + len(`[{"id":"c1"}]`) + len("tool") + len("c1") + len(`"42"`), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.r.PromptTokenBound(tt.imageTokens)
			if got != tt.want || ok != tt.ok {
				t.Fatalf("PromptTokenBound = %d, %v; want %d, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

// A text's UTF-8 bytes bound its tokens only if the bound is never below
// them: the bound of a request is at least the bytes of every text in it.
func TestPromptTokenBoundIsNeverBelowTheTextBytes(t *testing.T) {
	for _, s := range []string{"", "a", "hello world", strings.Repeat("token ", 1000), "日本語のテキスト", "\x00\x01 control \t\n", `"quoted" \ backslash`} {
		r := Request{Messages: []Message{TextMessage("user", s), TextMessage("system", s)}}
		got, ok := r.PromptTokenBound(0)
		if !ok || got < 2*len(s) {
			t.Fatalf("bound %d for two copies of a %d-byte text", got, len(s))
		}
	}
}

func TestMaxOutputTokensAndChoices(t *testing.T) {
	params := func(kv ...string) map[string]json.RawMessage {
		m := map[string]json.RawMessage{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = json.RawMessage(kv[i+1])
		}
		return m
	}
	for _, tt := range []struct {
		name    string
		params  map[string]json.RawMessage
		want    int
		set     bool
		choices int
	}{
		{"none", nil, 0, false, 1},
		{"max_tokens", params("max_tokens", "800"), 800, true, 1},
		{"max_completion_tokens", params("max_completion_tokens", "300"), 300, true, 1},
		{"both: the larger, whichever the provider reads", params("max_tokens", "800", "max_completion_tokens", "300"), 800, true, 1},
		{"an integral float", params("max_tokens", "64.0"), 64, true, 1},
		{"null is unset", params("max_tokens", "null"), 0, false, 1},
		{"zero, negative, fractional or a string: unset", params("max_tokens", "0", "max_completion_tokens", `"9"`), 0, false, 1},
		{"n choices", params("max_tokens", "10", "n", "3"), 10, true, 3},
		{"n not a positive integer", params("n", "0"), 0, false, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := Request{Params: tt.params}
			got, set := r.MaxOutputTokens()
			if got != tt.want || set != tt.set || r.Choices() != tt.choices {
				t.Fatalf("MaxOutputTokens = %d, %v, Choices = %d; want %d, %v, %d", got, set, r.Choices(), tt.want, tt.set, tt.choices)
			}
		})
	}
}

func TestWithMaxOutputTokensReplacesWhatTheRequestSetsAndCopies(t *testing.T) {
	orig := Request{Params: map[string]json.RawMessage{"max_completion_tokens": json.RawMessage("900"), "temperature": json.RawMessage("0.2")}}
	got := orig.WithMaxOutputTokens(100)
	if string(got.Params["max_completion_tokens"]) != "100" || got.Params["max_tokens"] != nil || string(got.Params["temperature"]) != "0.2" {
		t.Fatalf("params %s", got.Params)
	}
	if string(orig.Params["max_completion_tokens"]) != "900" {
		t.Fatal("the original request changed")
	}
	if n, _ := got.MaxOutputTokens(); n != 100 {
		t.Fatalf("bound %d", n)
	}
	none := Request{}.WithMaxOutputTokens(50)
	if string(none.Params["max_tokens"]) != "50" || len(none.Params) != 1 {
		t.Fatalf("params %s", none.Params)
	}
	both := Request{Messages: []Message{TextMessage("user", "x")}, Params: map[string]json.RawMessage{"max_completion_tokens": json.RawMessage("900"), "max_tokens": json.RawMessage("700")}}.WithMaxOutputTokens(20)
	if n, _ := both.MaxOutputTokens(); n != 20 || string(both.Params["max_tokens"]) != "20" {
		t.Fatalf("params %s", both.Params)
	}
	if err := both.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestPricesCost(t *testing.T) {
	p := Prices{Input: 2, CachedInput: 0.5, CacheWriteInput: 2.5, Output: 8}
	for _, tt := range []struct {
		name string
		u    Usage
		want float64
	}{
		{"no usage", Usage{}, 0},
		{"prompt and completion", Usage{PromptTokens: 1_000_000, CompletionTokens: 500_000}, 2 + 4},
		{"cached prompt tokens at the cached price", Usage{PromptTokens: 1000, CachedTokens: 600, CompletionTokens: 100}, (400*2 + 600*0.5 + 100*8) / 1e6},
		{"cache writes at the cache-write price", Usage{PromptTokens: 1000, CacheWriteTokens: 1000}, 1000 * 2.5 / 1e6},
		{"a total without its parts at the larger price", Usage{TotalTokens: 1000}, 1000 * 8 / 1e6},
		{"more cached than prompt is never a negative cost", Usage{PromptTokens: 10, CachedTokens: 20}, 20 * 0.5 / 1e6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.Cost(tt.u); math.Abs(got-tt.want) > 1e-12 {
				t.Fatalf("Cost = %v, want %v", got, tt.want)
			}
		})
	}
	if got, want := p.WorstCost(1000, 100), (1000*2.5+100*8)/1e6; math.Abs(got-want) > 1e-12 {
		t.Fatalf("WorstCost = %v, want %v (every prompt token at the dearest input price)", got, want)
	}
}

func TestPricesValidateNamesEachBadPrice(t *testing.T) {
	if err := (Prices{Input: 0.15, CachedInput: 0.075, Output: 0.6}).Validate(); err != nil {
		t.Fatal(err)
	}
	err := Prices{Input: -1, CachedInput: math.NaN(), CacheWriteInput: math.Inf(1), Output: MaxPrice + 1}.Validate()
	if !errors.Is(err, ErrInvalidPrices) {
		t.Fatalf("err %v", err)
	}
	for _, name := range []string{"input: negative", "cached_input: not a finite", "cache_write_input: not a finite", "output: above"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%q not in %v", name, err)
		}
	}
}

func TestUsageTokensAndReported(t *testing.T) {
	if (Usage{}).Reported() || !(Usage{CompletionTokens: 1}).Reported() {
		t.Fatal("Reported")
	}
	if got := (Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}).Tokens(); got != 15 {
		t.Fatal(got)
	}
	if got := (Usage{TotalTokens: 40}).Tokens(); got != 40 {
		t.Fatal(got)
	}
	if got := (Usage{PromptTokens: 1, CachedTokens: 2}).Add(Usage{PromptTokens: 3, CompletionTokens: 4}); got != (Usage{PromptTokens: 4, CompletionTokens: 4, CachedTokens: 2}) {
		t.Fatalf("%+v", got)
	}
}

// What sizing a large request costs the workflow before each attempt: a
// 64-message conversation of about 128 KiB with an image part.
func BenchmarkPromptTokenBound(b *testing.B) {
	msgs := make([]Message, 0, 65)
	for i := range 64 {
		msgs = append(msgs, TextMessage([]string{"user", "assistant"}[i%2], strings.Repeat("lorem ipsum ", 170)))
	}
	msgs = append(msgs, Message{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]`)})
	r := Request{Messages: msgs}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := r.PromptTokenBound(0); !ok {
			b.Fatal("unbounded")
		}
	}
}
