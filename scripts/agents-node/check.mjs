// The OpenAI Agents SDK (@openai/agents, on its defaults: the Responses
// API) against the gateway's POST /v1/responses, with the environment
// 'durallm dev' prints: OPENAI_BASE_URL and OPENAI_API_KEY, which the
// SDK's OpenAI client reads, and OPENAI_MODEL, a model of the gateway's.
// Tracing is off: its exporter sends every run to api.openai.com with
// the API key, which is the gateway's token here. A plain run, a streamed
// run, a function tool round trip (the demo model calls a declared tool
// once, then answers: the second request carries the function_call and
// its output), a refused member as the SDK's typed error, and an
// Idempotency-Key as a default header of the client. Prints one line per
// check; exits non-zero if one fails.
//
//   go run ./cmd/durallm dev     # elsewhere; then, with the export line it prints:
//   cd scripts/agents-node && npm install && OPENAI_MODEL=demo node check.mjs
import { Agent, run, tool, setTracingDisabled, setDefaultOpenAIClient, OpenAIResponsesModel } from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

setTracingDisabled(true);
const model = process.env.OPENAI_MODEL ?? 'demo';
const results = [];
function ok(name, cond, detail) {
  results.push(`${cond ? 'ok  ' : 'FAIL'} ${name}${detail ? ': ' + detail : ''}`);
  if (!cond) process.exitCode = 1;
}

// What reaches the gateway: each request's path and body, seen through
// the client's fetch (the SDK's own client, its defaults otherwise).
const sent = [];
const client = new OpenAI({
  fetch: async (url, init) => {
    sent.push({ url: String(url), body: init?.body ? JSON.parse(init.body) : undefined });
    return fetch(url, init);
  },
});
setDefaultOpenAIClient(client);

// 1. A plain run.
const agent = new Agent({ name: 'Assistant', instructions: 'Be brief.', model });
const plain = await run(agent, 'hi');
const last = sent[sent.length - 1];
ok('plain run (Responses)', typeof plain.finalOutput === 'string' && plain.finalOutput.length > 0 && last.url.endsWith('/responses'),
  `${JSON.stringify(plain.finalOutput)} via ${last.url}, response ${plain.lastResponseId}`);
ok('response id is the action id', plain.lastResponseId?.startsWith('gw-'), plain.lastResponseId);

// 2. A streamed run.
const streamed = await run(agent, 'tell me something', { stream: true });
let deltas = 0;
for await (const ev of streamed) {
  if (ev.type === 'raw_model_stream_event' && ev.data.type === 'output_text_delta') deltas++;
}
await streamed.completed;
ok('streamed run', typeof streamed.finalOutput === 'string' && streamed.finalOutput.length > 0 && deltas > 0,
  `${deltas} text deltas, ${JSON.stringify(streamed.finalOutput)}`);

// 3. A function tool round trip.
let calls = 0;
const getWeather = tool({
  name: 'get_weather', description: 'The weather in a city', parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => { calls++; return `18C and sunny in ${city}`; },
});
const withTool = new Agent({ name: 'Weather', instructions: 'Use the tool.', model, tools: [getWeather] });
const before = sent.length;
const weather = await run(withTool, 'weather in Paris?');
const second = sent[sent.length - 1].body;
const types = Array.isArray(second?.input) ? second.input.map((i) => i.type ?? i.role) : [];
ok('function tool round trip', calls === 1 && typeof weather.finalOutput === 'string' && sent.length - before === 2 &&
  types.includes('function_call') && types.includes('function_call_output'),
  `${calls} call, ${sent.length - before} requests, second input ${JSON.stringify(types)}, ${JSON.stringify(weather.finalOutput)}`);

// 4. A member the gateway cannot carry: a 400 naming it, as the SDK's typed error.
try {
  await run(new Agent({ name: 'Reasoner', model, modelSettings: { reasoning: { effort: 'high' } } }), 'hi');
  ok('refused member', false);
} catch (e) {
  ok('refused member', e instanceof OpenAI.BadRequestError && e.param === 'reasoning', `${e.constructor.name} ${e.status} ${e.message}`);
}

// 5. An idempotency key as a default header of the client: one agent
// run's requests are one logical request each, so a client made for one
// job sends the same key, and its second run replays the first answer.
const keyed = new OpenAI({ defaultHeaders: { 'Idempotency-Key': `agents-check-${Date.now()}` } });
const keyedAgent = new Agent({ name: 'Keyed', model: new OpenAIResponsesModel(keyed, model) });
const k1 = await run(keyedAgent, 'once');
const k2 = await run(keyedAgent, 'once');
ok('same key, same response', k1.lastResponseId === k2.lastResponseId && k1.finalOutput === k2.finalOutput, `${k1.lastResponseId} ${k2.lastResponseId}`);

console.log(results.join('\n'));
console.log('first request body:', JSON.stringify(sent[0].body));
