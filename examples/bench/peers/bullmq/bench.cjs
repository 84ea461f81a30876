// Peer driver: BullMQ running the queue-bench workloads.
//
// Same job (a sequence number, the producer's wall clock in µs, padding),
// same counts and the same output (one JSON line) as `queue-bench`.
// BullMQ's defaults are kept (completed jobs are kept, like queue-core's
// completion records); producers and the worker run in separate processes.
//
//   NODE_PATH=peers/.work/bullmq/node_modules node bench.cjs --redis-url URL enqueue --n 100000 --producers 16 [--batch 100]
//   ... process --n 100000 --concurrency 16 [--backlog 1000000]  (jobs waiting behind the measured ones)
//   ... e2e --n 100000 --producers 16 --concurrency 16 [--rate 2000] [--payload 1024]
//   ... bb --scenario queue-add|queue-add-bulk|worker-generic|worker-concurrent [--scale 1]
//       (bullmq-bench's four scenarios, as queue-bench's `bb` runs them: see
//       examples/bench/src/bullmq_bench.rs for the table)
'use strict';
const { spawn } = require('child_process');
const readline = require('readline');
const { randomUUID } = require('crypto');
const { Queue, Worker } = require('bullmq');
const IORedis = require('ioredis');

const QUEUE = 'bench';

function parseArgs(argv) {
  const o = { url: 'redis://127.0.0.1:6379/', mode: '' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a.startsWith('--')) {
      o[a.slice(2)] = argv[++i];
    } else {
      o.mode = a;
    }
  }
  if (o['redis-url']) o.url = o['redis-url'];
  return o;
}

const nowUs = () => Math.round((performance.timeOrigin + performance.now()) * 1000);

function connection(url) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port || 6379), maxRetriesPerRequest: null };
}

function summaryMs(v) {
  const a = Float64Array.from(v).sort();
  const q = (p) => {
    if (a.length === 0) return 0;
    const i = Math.min(Math.max(Math.ceil(p * a.length), 1), a.length) - 1;
    return Math.round(a[i]) / 1000;
  };
  return { count: a.length, p50_ms: q(0.5), p99_ms: q(0.99), p999_ms: q(0.999), max_ms: q(1) };
}

async function flush(url) {
  const r = new IORedis(connection(url));
  await r.flushall();
  await r.quit();
}

async function produce(url, n, producers, batch, payload, rate) {
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  const pad = 'x'.repeat(payload);
  const start = performance.now();
  const tasks = [];
  for (let i = 0; i < producers; i++) {
    const share = Math.floor(n / producers) + (i < n % producers ? 1 : 0);
    const everyMs = rate > 0 ? (batch * producers * 1000) / rate : 0;
    tasks.push((async () => {
      let sent = 0;
      let k = 0;
      while (sent < share) {
        if (everyMs > 0) {
          const wait = start + everyMs * k - performance.now();
          if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        }
        k++;
        const m = Math.min(batch, share - sent);
        const t = nowUs();
        if (m === 1) {
          await queue.add('noop', { seq: sent, t_us: t, pad });
        } else {
          const jobs = [];
          for (let j = 0; j < m; j++) jobs.push({ name: 'noop', data: { seq: sent + j, t_us: t, pad } });
          await queue.addBulk(jobs);
        }
        sent += m;
      }
    })());
  }
  await Promise.all(tasks);
  await queue.close();
}

async function consume(url, n, concurrency) {
  const lat = [];
  let done = 0;
  let endUs = 0;
  let finish;
  const finished = new Promise((r) => { finish = r; });
  const worker = new Worker(
    QUEUE,
    async (job) => {
      lat.push(nowUs() - job.data.t_us);
    },
    { connection: connection(url), concurrency, autorun: false },
  );
  // A job counts once BullMQ has moved it to completed.
  worker.on('completed', () => {
    done++;
    if (done === n) {
      endUs = nowUs();
      finish();
    }
  });
  await worker.waitUntilReady();
  const start = nowUs();
  worker.run();
  process.stdout.write(`READY ${start}\n`);
  await finished;
  await worker.close(true);
  process.stdout.write(JSON.stringify({ start_us: start, end_us: endUs, latency: summaryMs(lat) }) + '\n');
}

// bullmq-bench's scenarios: [warm-up, measured at scale 1, payload width, depth].
const BB = {
  'queue-add': [1000, 1000, 10, 10],
  'queue-add-bulk': [1000, 10000, 1, 1],
  'worker-generic': [1000, 1000, 1, 1],
  'worker-concurrent': [1000, 10000, 1, 1],
};

// `width` keys, each the head of a chain of `depth` nested objects keyed by UUIDs.
function sampleData(width, depth) {
  const top = {};
  for (let i = 0; i < width; i++) {
    let inner = {};
    for (let j = 1; j < depth; j++) inner = { [randomUUID()]: inner };
    top[randomUUID()] = inner;
  }
  return top;
}

// One scenario in this process; the stopwatch runs from the warm-up count to
// the last job (adds: when added; workers: when the handler starts).
async function bb(url, scenario, scale) {
  const shape = BB[scenario];
  if (!shape) throw new Error(`unknown scenario ${scenario}`);
  const [warmup, base, width, depth] = shape;
  const measured = base * Math.max(scale, 1);
  const total = warmup + measured;
  const data = sampleData(width, depth);
  await flush(url);
  const queue = new Queue(QUEUE, { connection: connection(url) });
  await queue.waitUntilReady();
  let seconds;
  if (scenario === 'queue-add' || scenario === 'queue-add-bulk') {
    const bulk = scenario === 'queue-add' ? 1 : 50;
    let count = 0;
    let start = performance.now();
    while (count < total) {
      const m = Math.min(bulk, total - count);
      if (count <= warmup && warmup < count + m) start = performance.now();
      if (m === 1) {
        await queue.add('test', data, {});
      } else {
        const jobs = [];
        for (let j = 0; j < m; j++) jobs.push({ name: 'test', data, opts: {} });
        await queue.addBulk(jobs);
      }
      count += m;
    }
    seconds = (performance.now() - start) / 1000;
  } else {
    for (let count = 0; count < total;) {
      const m = Math.min(100, total - count);
      const jobs = [];
      for (let j = 0; j < m; j++) jobs.push({ name: 'test', data });
      await queue.addBulk(jobs);
      count += m;
    }
    let count = 0;
    let start = 0;
    let finish;
    const finished = new Promise((r) => { finish = r; });
    const opts = { connection: connection(url) };
    if (scenario === 'worker-concurrent') opts.concurrency = 100;
    const worker = new Worker(QUEUE, async () => {
      count++;
      if (count === warmup) start = performance.now();
      else if (count === total) finish(performance.now());
    }, opts);
    const end = await finished;
    seconds = (end - start) / 1000;
    await worker.close(true);
  }
  await queue.close();
  return {
    workload: 'bb', scenario, warmup, n: measured, payload_bytes: JSON.stringify(data).length,
    seconds, jobs_per_s: Math.round(measured / seconds),
  };
}

// Microseconds Redis has spent in script calls so far (INFO commandstats).
async function scriptUsec(url) {
  const r = new IORedis(connection(url));
  const text = await r.info('commandstats');
  await r.quit();
  let usec = 0;
  for (const m of text.matchAll(/^cmdstat_(evalsha|eval|fcall):.*usec=(\d+)/gm)) usec += Number(m[2]);
  return usec;
}

function spawnConsumer(url, n, concurrency) {
  const child = spawn(process.execPath, [__filename, '--redis-url', url, 'consume', '--n', String(n), '--concurrency', String(concurrency)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const rl = readline.createInterface({ input: child.stdout });
  const lines = [];
  const waiters = [];
  rl.on('line', (l) => {
    if (waiters.length) waiters.shift()(l);
    else lines.push(l);
  });
  const next = () => (lines.length ? Promise.resolve(lines.shift()) : new Promise((r) => waiters.push(r)));
  return { child, next };
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const n = Number(o.n || 100000);
  const producers = Number(o.producers || 1);
  const batch = Number(o.batch || 1);
  const payload = Number(o.payload || 0);
  const rate = Number(o.rate || 0);
  const concurrency = Number(o.concurrency || 16);
  let out;
  if (o.mode === 'bb') {
    out = await bb(o.url, o.scenario, Number(o.scale || 1));
  } else if (o.mode === 'consume') {
    await consume(o.url, n, concurrency);
    return;
  } else if (o.mode === 'enqueue') {
    await flush(o.url);
    const t = performance.now();
    await produce(o.url, n, producers, batch, payload, 0);
    const s = (performance.now() - t) / 1000;
    out = { workload: 'enqueue', n, producers, batch, payload, seconds: s, jobs_per_s: Math.round(n / s) };
  } else if (o.mode === 'process') {
    await flush(o.url);
    await produce(o.url, n, 4, 1000, payload, 0);
    // `--backlog B`: B more jobs wait behind the n measured ones (added
    // first, so taken first), as queue-bench cost-backlog does.
    const backlog = Number(o.backlog || 0);
    if (backlog > 0) await produce(o.url, backlog, 4, 1000, payload, 0);
    const before = await scriptUsec(o.url);
    const c = spawnConsumer(o.url, n, concurrency);
    const start = Number((await c.next()).split(' ')[1]);
    const r = JSON.parse(await c.next());
    const s = (r.end_us - start) / 1e6;
    // Redis time inside scripts while the measured jobs ran (the preload excluded).
    const consumeUsec = ((await scriptUsec(o.url)) - before) / n;
    out = {
      workload: 'process', n, concurrency, payload, backlog, seconds: s, jobs_per_s: Math.round(n / s),
      consume_scripts_usec_per_job: Math.round(consumeUsec * 1000) / 1000,
    };
  } else if (o.mode === 'e2e') {
    await flush(o.url);
    const c = spawnConsumer(o.url, n, concurrency);
    await c.next();
    const t0 = nowUs();
    await produce(o.url, n, producers, batch, payload, rate);
    const r = JSON.parse(await c.next());
    const s = (r.end_us - t0) / 1e6;
    out = {
      workload: rate > 0 ? 'e2e-rate' : 'e2e', n, producers, batch, payload, rate, concurrency,
      seconds: s, jobs_per_s: Math.round(n / s), latency: r.latency,
    };
  } else {
    throw new Error(`unknown mode ${o.mode} (enqueue | process | e2e | bb)`);
  }
  out.system = 'bullmq';
  out.version = `bullmq ${require('bullmq/package.json').version}, node ${process.version}`;
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
