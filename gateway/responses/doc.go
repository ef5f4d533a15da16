// Package responses is the gateway's Responses surface: the wire format of
// OpenAI's POST /v1/responses over the gateway's action core
// (answer.Surface), one durable action per response. A request body is
// read into the envelope (providers.Request, chat-shaped, which every
// route reads: instructions and input items become chat messages, function
// tools chat tools, text.format the response_format); an answer is
// rendered as a response object whose id is the action id; a stream as
// the Responses events, whose sequence_number is the number the core
// resumes after (GET /v1/responses/{id}?stream=true&starting_after=N); a
// problem (answer.Problem, whose kind the core decides) as OpenAI's error
// object with chat's statuses and x-should-retry (package openaiwire). It
// decides nothing about actions (docs/gateway.md).
//
// What it refuses: every member the envelope cannot carry is a 400 naming
// it (param), never dropped: built-in tools (web_search, file_search,
// code interpreter, MCP, ...), conversation, reasoning, prompt, include,
// truncation other than disabled, and any member it does not know. What it
// reads and sets aside, because leaving it out changes neither the
// question nor the answer's shape, is named in the answers'
// X-Durallm-Ignored header (IgnoredMembers). previous_response_id and
// background are the stored responses' (state.go): the gateway's core
// reads them first (ParseState), and Parse alone refuses them.
//
// The request is read, and the answers written, with wire structs of this
// package rather than openai-go's responses types, which can neither keep
// nor refuse a member they do not know, and whose answer types marshal
// members OpenAI never sends (TestWhyRequestsAndAnswersUseTheirOwnWireStructs).
// openai-go is the judge instead: its Responses client builds the requests
// the tests parse and reads the answers, and its Responses accumulator
// checks the events' protocol (sdk_test.go, and gateway/e2e against the
// real gateway).
//
// # Which answers the Responses clients send again
//
// The Responses clients are the OpenAI SDKs (openai-go, openai-node,
// openai-python) and what runs on them (the OpenAI Agents SDK, Codex),
// and the AI SDK's @ai-sdk/openai: the same clients, with the same rules,
// as chat completions (docs/gateway.md, "Which answers which client
// resends"). So every problem is answered as chat answers it: an answer
// whose action may have run (awaiting a verdict, maybe started,
// indeterminate, canceled, still running) is a 403 with x-should-retry:
// false, which none of them resends.
//
// # A stream that does not end with an answer
//
// Once the stream's 200 went out, an end without a whole answer is, after
// the done events of what is whole (the open message's part and item,
// incomplete; each function call whose arguments are whole JSON),
// response.failed, the response with status failed and its error (code:
// why the stream was cut, or the problem's code), then chat's in-band
// error object, {"error": {...}}, not numbered: openai-go raises it as an
// *ssestream.StreamError and openai-node as an APIError, after the events
// that arrived. A stream never ends with neither response.completed (or
// .incomplete) nor that error.
package responses
