// Drives happy LLMActions from Temporal's TypeScript client, the way
// 'durallm load' does from Go: --concurrency callers, each starting an
// action and waiting for its result, then the next; --warmup actions
// first, left out. Prints one JSON line like 'durallm load --json'.
//
//   cd scripts/load-ts && npm install && node load.mjs --route demo-primary --actions 400 --concurrency 16
//
// TEMPORAL_ADDRESS (default 127.0.0.1:7233) and TEMPORAL_NAMESPACE
// (default "default") say where the server is; --task-queue (durallm).
import { Connection, Client } from '@temporalio/client';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const route = args.route;
if (!route) {
  console.error('load.mjs: --route is required');
  process.exit(2);
}
const actions = Number(args.actions ?? 400);
const concurrency = Number(args.concurrency ?? 16);
const warmup = Number(args.warmup ?? 20);
const taskQueue = args['task-queue'] ?? 'durallm';
const prefix = args['id-prefix'] ?? `load-ts-${Date.now()}-`;

const connection = await Connection.connect({ address: process.env.TEMPORAL_ADDRESS ?? '127.0.0.1:7233' });
const client = new Client({ connection, namespace: process.env.TEMPORAL_NAMESPACE ?? 'default' });
const input = { request: { messages: [{ role: 'user', content: 'hi' }] }, routes: route.split(',') };

let seq = 0;
async function run(n, conc) {
  const lat = [];
  let failed = 0;
  let left = n;
  async function caller() {
    while (left > 0) {
      left--;
      const id = `${prefix}${++seq}`;
      const t0 = process.hrtime.bigint();
      const h = await client.workflow.start('LLMAction', { workflowId: id, taskQueue, args: [input] });
      const res = await h.result();
      lat.push(Number(process.hrtime.bigint() - t0) / 1e6);
      if (res.state !== 'completed') failed++;
    }
  }
  await Promise.all(Array.from({ length: conc }, caller));
  return { lat, failed };
}

if (warmup > 0) await run(warmup, concurrency);
const cpu0 = process.cpuUsage();
const t0 = process.hrtime.bigint();
const { lat, failed } = await run(actions, concurrency);
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = process.cpuUsage(cpu0);
lat.sort((a, b) => a - b);
const pct = (p) => Math.round(lat[Math.min(lat.length - 1, Math.floor(lat.length * p / 100))] * 10) / 10;
console.log(JSON.stringify({
  client: 'typescript', actions: lat.length, concurrency, failed, seconds,
  actions_per_second: lat.length / seconds, p50_ms: pct(50), p90_ms: pct(90), p99_ms: pct(99),
  client_cpu_ms_per_action: (cpu.user + cpu.system) / 1000 / lat.length,
}));
await connection.close();
process.exit(failed > 0 ? 1 : 0);
