// @anthropic-ai/sdk (the Node SDK Claude Code is built on) on its defaults
// against the gateway's Messages API, with the environment 'durallm dev'
// prints: ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN (or ANTHROPIC_API_KEY),
// ANTHROPIC_MODEL. A plain and a streamed answer, a tool_use round trip
// (the demo model calls a declared tool once, then answers), Anthropic's
// errors as the SDK's typed errors, count_tokens's 501, the models, and
// an Idempotency-Key as a default header of the client and as a request
// option. Prints one line per check; exits non-zero if one fails.
//
//   go run ./cmd/durallm dev     # elsewhere; then, with the export line it prints:
//   cd scripts/anthropic-node && npm install && node check.mjs
import Anthropic from '@anthropic-ai/sdk';

const model = process.env.ANTHROPIC_MODEL;
const results = [];
function ok(name, cond, detail) {
  results.push(`${cond ? 'ok  ' : 'FAIL'} ${name}${detail ? ': ' + detail : ''}`);
  if (!cond) process.exitCode = 1;
}

const client = new Anthropic(); // reads the environment
// 1. A plain answer.
const { data: msg, response } = await client.messages.create({ model, max_tokens: 256, messages: [{ role: 'user', content: 'hi' }] }).withResponse();
ok('plain answer', msg.type === 'message' && msg.content[0].type === 'text' && msg.id.startsWith('gw-'),
  `${msg.id} ${msg.stop_reason} ${JSON.stringify(msg.content)} request-id=${response.headers.get('request-id')} x-should-retry=${response.headers.get('x-should-retry')}`);
ok('request id', msg._request_id === msg.id, msg._request_id);

// 2. A streamed answer, accumulated by the SDK's MessageStream.
const stream = client.messages.stream({ model, max_tokens: 256, messages: [{ role: 'user', content: 'tell me something' }] });
let deltas = 0;
stream.on('text', () => deltas++);
const final = await stream.finalMessage();
ok('streamed answer', final.content[0].type === 'text' && final.content[0].text.length > 0 && deltas > 0 && final.stop_reason === 'end_turn',
  `${deltas} text deltas, ${JSON.stringify(final.content[0].text)} ${final.stop_reason} usage=${JSON.stringify(final.usage)}`);

// 3. A tool_use round trip (the demo model calls a declared tool once, then answers).
const tools = [{ name: 'get_weather', description: 'The weather in a city', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
const q = { role: 'user', content: 'weather in Paris?' };
const first = await client.messages.create({ model, max_tokens: 256, tools, messages: [q] });
const use = first.content.find((b) => b.type === 'tool_use');
ok('tool_use', first.stop_reason === 'tool_use' && use && use.name === 'get_weather', JSON.stringify(first.content));
const second = await client.messages.create({ model, max_tokens: 256, tools, messages: [q, { role: 'assistant', content: first.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18C, sunny' }] }] });
ok('tool_result answered', second.stop_reason === 'end_turn' && second.content[0].type === 'text', JSON.stringify(second.content));
// Streamed, the tool call accumulates.
const st = await client.messages.stream({ model, max_tokens: 256, tools, messages: [q] }).finalMessage();
const su = st.content.find((b) => b.type === 'tool_use');
ok('streamed tool_use', su && JSON.stringify(su.input) === JSON.stringify(use.input), JSON.stringify(st.content));

// 4. Errors, in Anthropic's shape, as the SDK's typed errors.
try {
  await client.messages.create({ model: 'no-such-model', max_tokens: 8, messages: [q] });
  ok('unknown model', false);
} catch (e) {
  ok('unknown model', e instanceof Anthropic.NotFoundError && e.error?.error?.type === 'not_found_error', `${e.constructor.name} ${e.status} ${e.message}`);
}
try {
  await client.messages.create({ model, max_tokens: 8, messages: [q], container: 'c' });
  ok('refused member', false);
} catch (e) {
  ok('refused member', e instanceof Anthropic.BadRequestError && e.message.includes('container'), `${e.constructor.name} ${e.status} ${e.message}`);
}
try {
  await new Anthropic({ authToken: 'wrong', apiKey: null }).messages.create({ model, max_tokens: 8, messages: [q] });
  ok('unknown key', false);
} catch (e) {
  ok('unknown key', e instanceof Anthropic.AuthenticationError, `${e.constructor.name} ${e.status} ${e.message}`);
}
try {
  await client.messages.countTokens({ model, messages: [q] });
  ok('count_tokens', false);
} catch (e) {
  ok('count_tokens 501', e.status === 501 && e.message.includes('count_tokens'), `${e.constructor.name} ${e.status}`);
}

// 5. The models, in Anthropic's shape.
const ids = [];
for await (const m of client.models.list()) ids.push(m.id);
ok('models', ids.includes(model), ids.join(','));

// 6. An idempotency key: a default header of the client, or per request.
const keyed = new Anthropic({ defaultHeaders: { 'Idempotency-Key': `check-${Date.now()}` } });
const k1 = await keyed.messages.create({ model, max_tokens: 64, messages: [{ role: 'user', content: 'once' }] });
const { data: k2, response: r2 } = await keyed.messages.create({ model, max_tokens: 64, messages: [{ role: 'user', content: 'once' }] }).withResponse();
ok('same key, same message (default header)', k1.id === k2.id && r2.headers.get('x-durallm-replayed') === 'true', `${k1.id} ${k2.id}`);
const perRequest = { headers: { 'Idempotency-Key': `check-req-${Date.now()}` } };
const p1 = await client.messages.create({ model, max_tokens: 64, messages: [{ role: 'user', content: 'once' }] }, perRequest);
const p2 = await client.messages.create({ model, max_tokens: 64, messages: [{ role: 'user', content: 'once' }] }, perRequest);
ok('same key, same message (request option)', p1.id === p2.id, `${p1.id} ${p2.id}`);

console.log(results.join('\n'));
