package providertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/durallm/durallm/providers"
)

// runStream executes b for one stream whose request is complete. It runs
// on its own goroutine and ends the stream when it returns.
func (c *conn) runStream(st *stream, req Request, b Behavior, done func()) {
	defer c.p.wg.Done()
	defer done()
	defer c.endStream(st)

	// Checking and recording under c.mu makes "abandoned by a GOAWAY" and
	// "started executing" mutually exclusive: a stream the provider
	// disowned before it started is never recorded as processed.
	c.mu.Lock()
	if st.closed {
		c.mu.Unlock()
		return
	}
	if b.executed() {
		c.p.addProcessed(st.rec)
	}
	c.mu.Unlock()
	c.p.keep(&req, b)

	if !c.pause(st, b) {
		return
	}
	switch b.kind {
	case kindDefault:
		c.answer(st, req, Answer(defaultAnswer))
	case kindAnswer:
		c.answer(st, req, b)
	case kindToolCall, kindAnswerOrCallTool:
		if text, call := b.reply(req); call != nil {
			c.answerTool(st, req, call)
		} else {
			c.answer(st, req, Answer(text))
		}
	case kindGoAway:
		c.goAwayBehavior(st, b)
	case kindRefuse, kindReset:
		_ = c.writeStream(st, func() error { return c.fr.WriteRSTStream(st.id, b.code) })
	case kindHintsThenRefuse:
		if c.writeHeaders(st, []hpack.HeaderField{{Name: ":status", Value: "103"}, {Name: "link", Value: "</style.css>; rel=preload"}}, false) == nil {
			_ = c.writeStream(st, func() error { return c.fr.WriteRSTStream(st.id, b.code) })
		}
	case kindCloseAfterRead:
		c.closeGracefully()
	case kindStatus:
		c.status(st, b)
	case kindEmptyBody:
		_ = c.writeHeaders(st, []hpack.HeaderField{
			{Name: ":status", Value: "200"},
			{Name: "content-type", Value: "application/json"},
			{Name: "content-length", Value: "0"},
		}, true)
	case kindNoChoices:
		body := c.p.completionJSON(req, nil)
		_ = c.respond(st, http.StatusOK, jsonFields(len(body)), body)
	case kindStreamStall:
		if c.sseChunks(st, b) {
			<-st.done
		}
	case kindStreamCut:
		if c.sseChunks(st, b) {
			c.cut(st, b.cut)
		}
	case kindBodyCut:
		fields := append([]hpack.HeaderField{{Name: ":status", Value: strconv.Itoa(b.status)}}, statusFields(b.header)...)
		if c.writeHeaders(st, fields, false) != nil {
			return
		}
		if b.body != "" && c.writeData(st, []byte(b.body), false) != nil {
			return
		}
		c.cut(st, b.cut)
	case kindHold:
		<-st.done
	case kindListStored:
		body := c.p.storedList(req)
		_ = c.respond(st, http.StatusOK, jsonFields(len(body)), body)
	}
}

// cut ends a stream whose response is under way without END_STREAM, as
// how says.
func (c *conn) cut(st *stream, how CutMode) {
	switch how {
	case CutClose:
		c.closeGracefully()
	case CutGoAway:
		// This stream at the last-stream-id: the client learns it may
		// have been processed, and its body read fails with the GOAWAY.
		c.goAway(st.id, false, http2.ErrCodeNo, goAwayDebug)
		c.closeGracefully()
	default:
		_ = c.writeStream(st, func() error { return c.fr.WriteRSTStream(st.id, http2.ErrCodeInternal) })
	}
}

// pause applies WaitFor and After. It reports false if the stream ended
// while waiting.
func (c *conn) pause(st *stream, b Behavior) bool { return b.pause(st.done, nil) }

// pause applies WaitFor, then After. It reports false if either channel
// (nil never fires) closed first: the request's end, the provider's.
func (b Behavior) pause(ended, closing <-chan struct{}) bool {
	if b.gate != nil {
		select {
		case <-b.gate:
		case <-ended:
			return false
		case <-closing:
			return false
		}
	}
	if b.delay > 0 {
		t := time.NewTimer(b.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ended:
			return false
		case <-closing:
			return false
		}
	}
	return true
}

// goAwayBehavior runs GoAwayAbove, GoAwayAfterProcessing and GoAwayAt.
func (c *conn) goAwayBehavior(st *stream, b Behavior) {
	last := b.lastFor(st.id)
	if b.code2 != nil {
		c.goAway(last, false, b.code, goAwayDebug, *b.code2)
	} else {
		c.goAway(last, false, b.code, goAwayDebug)
	}
	if st.id <= last {
		// The GOAWAY tells the client this stream may have been
		// processed; closing without an answer leaves it exactly that
		// ambiguous.
		c.closeGracefully()
		return
	}
	// goAway has abandoned this stream. Streams at or below last keep
	// running; endStream closes the connection when none is left, and this
	// timer bounds how long a stuck one can keep it open.
	c.p.wg.Add(1)
	go c.closeAfter(goAwayCloseBound)
}

// respond writes a complete response: headers, then body with END_STREAM.
func (c *conn) respond(st *stream, status int, fields []hpack.HeaderField, body []byte) error {
	all := append([]hpack.HeaderField{{Name: ":status", Value: strconv.Itoa(status)}}, fields...)
	if err := c.writeHeaders(st, all, len(body) == 0); err != nil {
		return err
	}
	if len(body) == 0 {
		return nil
	}
	return c.writeData(st, body, true)
}

// jsonFields are the headers of an application/json body of length n.
func jsonFields(n int) []hpack.HeaderField {
	return []hpack.HeaderField{
		{Name: "content-type", Value: "application/json"},
		{Name: "content-length", Value: strconv.Itoa(n)},
	}
}

// connectionSpecific lists headers HTTP/2 forbids (RFC 9113 §8.2.2); a
// client would reject the whole response if we sent one.
var connectionSpecific = map[string]bool{
	"connection":        true,
	"keep-alive":        true,
	"proxy-connection":  true,
	"transfer-encoding": true,
	"upgrade":           true,
	"content-length":    true, // we always send the true length ourselves
}

// status runs the Status behaviour family.
func (c *conn) status(st *stream, b Behavior) {
	fields := append(statusFields(b.header), hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(b.body))})
	_ = c.respond(st, b.status, fields, []byte(b.body))
}

// statusFields are the response headers of the Status family: header's,
// lower-cased and without the connection-specific ones, plus
// application/json unless header sets a Content-Type. No content-length:
// the caller adds the true one when it knows it.
func statusFields(header http.Header) []hpack.HeaderField {
	fields := []hpack.HeaderField{}
	hasType := false
	keys := make([]string, 0, len(header))
	for k := range header {
		keys = append(keys, k)
	}
	// Sorted so the HPACK output, and any capture of it, is reproducible.
	slices.Sort(keys)
	for _, k := range keys {
		name := strings.ToLower(k)
		if name == "" || strings.HasPrefix(name, ":") || connectionSpecific[name] {
			continue
		}
		if name == "content-type" {
			hasType = true
		}
		for _, v := range header[k] {
			fields = append(fields, hpack.HeaderField{Name: name, Value: v})
		}
	}
	if !hasType {
		fields = append(fields, hpack.HeaderField{Name: "content-type", Value: "application/json"})
	}
	return fields
}

// answer runs Answer (and AnswerThenKeepOpen): SSE if the request asked
// to stream, JSON otherwise.
func (c *conn) answer(st *stream, req Request, b Behavior) {
	text, midGate := b.text, b.midGate
	if !req.Stream {
		body := c.p.completionJSON(req, &text)
		_ = c.respond(st, http.StatusOK, jsonFields(len(body)), body)
		return
	}
	if err := c.writeHeaders(st, sseFields(), false); err != nil {
		return
	}
	id, created := c.p.idFor(req), time.Now().Unix()
	for i, w := range splitWords(text) {
		if err := c.writeData(st, c.p.chunkEvent(id, created, w, i == 0), false); err != nil {
			return
		}
		if i == 0 && midGate != nil && !c.pause(st, Behavior{gate: midGate}) {
			return
		}
	}
	stop := "stop"
	final := chatCompletion{
		ID:      id,
		Object:  "chat.completion.chunk",
		Created: created,
		Model:   c.p.model,
		Choices: []choice{{Index: 0, Delta: &message{}, FinishReason: &stop}},
		Usage:   usageFor(req, text),
	}
	tail := append(sseEvent(mustJSON(final)), "data: [DONE]\n\n"...)
	if err := c.writeData(st, tail, !b.keepOpen); err != nil || !b.keepOpen {
		return
	}
	keepOpen(st.done, nil, func() error { return c.writeData(st, []byte(keepAliveComment), false) })
}

// keepOpen runs AnswerThenKeepOpen's endless tail: write every
// keepOpenInterval until it fails or ended or closing (nil: never) closes.
func keepOpen(ended, closing <-chan struct{}, write func() error) {
	t := time.NewTicker(keepOpenInterval)
	defer t.Stop()
	for {
		if write() != nil {
			return
		}
		select {
		case <-t.C:
		case <-ended:
			return
		case <-closing:
			return
		}
	}
}

// sseChunks starts an SSE response and sends n content chunks, reporting
// whether all of them were written.
func (c *conn) sseChunks(st *stream, b Behavior) bool {
	if err := c.writeHeaders(st, sseFields(), false); err != nil {
		return false
	}
	id, created := c.p.nextID(), time.Now().Unix()
	for i := range b.chunks {
		w := "chunk" + strconv.Itoa(i+1)
		if i > 0 {
			w = " " + w
		}
		if i == 1 && b.midGate != nil && !c.pause(st, Behavior{gate: b.midGate}) {
			return false
		}
		if err := c.writeData(st, c.p.chunkEvent(id, created, w, i == 0), false); err != nil {
			return false
		}
	}
	return true
}

func sseFields() []hpack.HeaderField {
	return []hpack.HeaderField{
		{Name: ":status", Value: "200"},
		{Name: "content-type", Value: "text/event-stream"},
		{Name: "cache-control", Value: "no-cache"},
	}
}

// chunkEvent renders one chat.completion.chunk SSE event carrying
// content. The first also carries the assistant role, as OpenAI's does,
// so every event the client counts is a content event.
func (p *Provider) chunkEvent(id string, created int64, content string, first bool) []byte {
	msg := &message{Content: &content}
	if first {
		msg.Role = "assistant"
	}
	return sseEvent(mustJSON(chatCompletion{
		ID:      id,
		Object:  "chat.completion.chunk",
		Created: created,
		Model:   p.model,
		Choices: []choice{{Index: 0, Delta: msg}},
	}))
}

func sseEvent(data []byte) []byte {
	out := make([]byte, 0, len(data)+8)
	out = append(out, "data: "...)
	out = append(out, data...)
	return append(out, "\n\n"...)
}

// completionJSON renders a chat.completion; a nil text means "no choices".
func (p *Provider) completionJSON(req Request, text *string) []byte {
	cc := chatCompletion{
		ID:      p.idFor(req),
		Object:  "chat.completion",
		Created: time.Now().Unix(),
		Model:   p.model,
		Choices: []choice{},
	}
	content := ""
	if text != nil {
		content = *text
		stop := "stop"
		cc.Choices = append(cc.Choices, choice{
			Index:        0,
			Message:      &message{Role: "assistant", Content: text},
			FinishReason: &stop,
		})
	}
	cc.Usage = usageFor(req, content)
	return mustJSON(cc)
}

func (p *Provider) nextID() string {
	return fmt.Sprintf("chatcmpl-durallm-%d", p.respSeq.Add(1))
}

// The OpenAI chat-completions response shapes, with only the members the
// provider fills in.
type chatCompletion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
}

type choice struct {
	Index        int      `json:"index"`
	Message      *message `json:"message,omitempty"`
	Delta        *message `json:"delta,omitempty"`
	FinishReason *string  `json:"finish_reason"`
}

type message struct {
	Role      string         `json:"role,omitempty"`
	Content   *string        `json:"content,omitempty"`
	ToolCalls []toolCallJSON `json:"tool_calls,omitempty"`
}

type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *tokenDetails `json:"prompt_tokens_details,omitempty"`
}

type tokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// usageFor is the usage an answer reports: the behaviour's own
// ([Behavior.WithUsage]), else an estimate: a quarter of the request
// body's bytes for the prompt (the usual rule of thumb) and one token per
// word of the answer. Tests only need plausible, deterministic numbers.
func usageFor(req Request, text string) *usage {
	if u := req.usage; u != nil {
		out := &usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
		if u.CachedTokens > 0 {
			out.PromptTokensDetails = &tokenDetails{CachedTokens: u.CachedTokens}
		}
		return out
	}
	prompt := promptTokens(req.Body)
	completion := len(strings.Fields(text))
	return &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// promptTokens is the prompt tokens an answer to body reports.
func promptTokens(body []byte) int { return max(1, len(body)/4) }

// mustJSON marshals values built from the types above, which cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("providertest: marshal response: %v", err))
	}
	return b
}

// parseBody fills Model and Stream (and what keep reads) from a JSON
// request body. Anything
// unreadable just leaves them empty: the body belongs to the client under
// test, and a fault-injecting server must not fail on it.
func parseBody(req *Request) {
	var in struct {
		Model    string          `json:"model"`
		Stream   bool            `json:"stream"`
		Store    bool            `json:"store"`
		Metadata json.RawMessage `json:"metadata"`
	}
	// Only the members that may name these are decoded: encoding/json
	// would scan the whole body, a long conversation included.
	body := membersNamed(req.Body, "model", "stream", "store", "metadata")
	// On a type mismatch Unmarshal still fills the members it can.
	err := json.Unmarshal(body, &in)
	req.Model, req.Stream = in.Model, in.Stream
	req.store, req.metadata = in.Store, in.Metadata
	if err != nil {
		// The completion is stored only when store and metadata decode,
		// whatever the other members hold.
		var kept struct {
			Store    bool            `json:"store"`
			Metadata json.RawMessage `json:"metadata"`
		}
		err = json.Unmarshal(body, &kept)
		req.store, req.metadata = kept.Store && err == nil, kept.Metadata
	}
}

// membersNamed is the JSON object body with only its members whose names
// match one of names as encoding/json matches a field's (any case), or
// body itself when it is not a JSON object. Decoding it fills what
// decoding body would for those names.
func membersNamed(body []byte, names ...string) []byte {
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' || !providers.ValidJSON(body) {
		return body
	}
	out := []byte{'{'}
	for i = skipSpace(body, i+1); body[i] != '}'; {
		nameEnd := stringEnd(body, i+1)
		valueStart := skipSpace(body, skipSpace(body, nameEnd)+1) // past ':'
		valueEnd := jsonValueEnd(body, valueStart)
		var name string
		_ = json.Unmarshal(body[i:nameEnd], &name) // a checked string
		if slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, name) }) {
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(append(append(out, body[i:nameEnd]...), ':'), body[valueStart:valueEnd]...)
		}
		if i = skipSpace(body, valueEnd); body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	return append(out, '}')
}

// skipSpace, stringEnd and jsonValueEnd walk JSON that ValidJSON has
// checked: the index past white space, past the string whose contents
// begin at b[i], past the value that begins at b[i].
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

func stringEnd(b []byte, i int) int {
	for ; b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

func jsonValueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i+1)
	case '{', '[':
		depth := 0
		for {
			switch b[i] {
			case '"':
				i = stringEnd(b, i+1)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
	}
	for i < len(b) && !strings.ContainsRune(",}] \t\r\n", rune(b[i])) {
		i++
	}
	return i
}

// splitWords cuts text into words, each after the first keeping the
// whitespace before it, so the pieces concatenate back to text.
func splitWords(text string) []string {
	var out []string
	start, inWord := 0, false
	for i := 0; i < len(text); {
		r, size := utf8.DecodeRuneInString(text[i:])
		if unicode.IsSpace(r) {
			if inWord {
				out = append(out, text[start:i])
				start, inWord = i, false
			}
		} else {
			inWord = true
		}
		i += size
	}
	if start < len(text) {
		out = append(out, text[start:])
	}
	return out
}
