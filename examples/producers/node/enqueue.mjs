// Enqueue a job for a Rust queue-core worker from Node (ioredis + msgpackr).
//
// The wire format is described in docs/PROTOCOL.md. In short: the job is
// written by one Lua script (the queue-core prelude followed by enqueue.lua)
// with eight keys that share the hash tag `{queue}`, and the payload is the
// MessagePack of the handler's argument type (structs as maps keyed by field
// name, enums externally tagged: "Unit" or {"Variant": value}, null as nil).
//
// Integers: msgpackr writes a JavaScript number outside the 32-bit range as
// a float64, which a Rust integer field refuses. `toWire` turns every safe
// integer outside that range into a BigInt (written as int64/uint64); pass
// BigInt yourself for integers above 2^53. A Rust f64 field accepts both.
//
// As a module:
//   import Redis from "ioredis";
//   import { Producer, loadScript } from "./enqueue.mjs";
//   const producer = new Producer(new Redis(url), loadScript());
//   await producer.enqueue("emails", "send_welcome", { email: "a@example.com" }, { id: "signup-42" });
//   // → { outcome: "created", id } | { outcome: "duplicate", id, state } | { outcome: "already-completed", id }
//
// From the command line (the same flags as `queue-watchdog enqueue`):
//   node enqueue.mjs --redis URL -q emails --type send_welcome --json '{"email":"a@example.com"}'

import { createHash, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import Redis from "ioredis";
import { Packr } from "msgpackr";

const HERE = dirname(fileURLToPath(import.meta.url));
// Copy prelude.lua and enqueue.lua next to your producer, or point QUEUE_SCRIPTS_DIR at them.
const DEFAULT_SCRIPTS_DIR = join(HERE, "..", "..", "..", "queue-core", "src", "scripts");

// Plain MessagePack maps (no msgpackr record extension, which Rust cannot read).
const packr = new Packr({ useRecords: false, moreTypes: false });

/** The enqueue script exactly as queue-core sends it: prelude, a newline, enqueue.lua. */
export function loadScript(dir = process.env.QUEUE_SCRIPTS_DIR || DEFAULT_SCRIPTS_DIR) {
  const prelude = readFileSync(join(dir, "prelude.lua"), "utf8");
  const body = readFileSync(join(dir, "enqueue.lua"), "utf8");
  return `${prelude}\n${body}`;
}

/** KEYS of enqueue.lua, in order (the QueueKeys layout). */
export function queueKeys(queue, id) {
  const base = `q:{${queue}}:`;
  return [`${base}main`, `${base}job:${id}`, `${base}done:${id}`, `${base}delayed`, `${base}stats`, `${base}once:${id}`, `${base}wake`,
    `${base}guard`]; // never written: see docs/PROTOCOL.md, section 2
}

/** The id rules queue-core enforces: 1..512 bytes of UTF-8, no control characters. */
export function checkId(id) {
  const size = Buffer.byteLength(id, "utf8");
  if (size === 0 || size > 512) throw new Error(`job id must be 1 to 512 bytes, got ${size}`);
  if (/[\u0000-\u001f\u007f-\u009f]/.test(id)) throw new Error("job id must not contain control characters");
}

/** A copy of `value` that msgpackr encodes the way Rust's serde types decode. */
export function toWire(value) {
  if (typeof value === "number" && Number.isSafeInteger(value) && (value > 0xffffffff || value < -0x80000000)) {
    return BigInt(value);
  }
  if (value === undefined) return null;
  if (Array.isArray(value)) return value.map(toWire);
  if (value !== null && typeof value === "object" && !(value instanceof Uint8Array)) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, toWire(v)]));
  }
  return value;
}

/** Enqueues jobs through queue-core's enqueue script (EVALSHA, loaded on NOSCRIPT). */
export class Producer {
  constructor(redis, scriptText) {
    this.redis = redis;
    this.sha = createHash("sha1").update(scriptText).digest("hex");
    // ioredis sends EVALSHA and falls back to EVAL (which caches the script) on NOSCRIPT.
    redis.defineCommand("queueCoreEnqueue", { numberOfKeys: 8, lua: scriptText });
  }

  /**
   * Writes one job. Resolves only once Redis answered; rejects on any error
   * (retry with the same `id` to make a retry a no-op).
   */
  async enqueue(queue, type, args, { id = randomUUID(), delayMs = 0, runAtMs = 0, maxAttempts = 25, schemaVersion = 1 } = {}) {
    checkId(id);
    const payload = packr.pack(toWire(args));
    const reply = await this.redis.queueCoreEnqueue(
      ...queueKeys(queue, id),
      id, type, String(schemaVersion), payload, String(Math.max(1, maxAttempts)),
      String(delayMs), String(runAtMs), "0",
    );
    switch (String(reply[0])) {
      case "new": return { outcome: "created", id };
      case "exists": return { outcome: "duplicate", id, state: String(reply[1]) };
      case "done": return { outcome: "already-completed", id };
      default: throw new Error(`queue ${queue}, job ${id}: unknown enqueue reply ${JSON.stringify(reply)}`);
    }
  }
}

async function main() {
  const { values: a } = parseArgs({
    options: {
      redis: { type: "string", default: process.env.REDIS_URL || "redis://127.0.0.1:6379/" },
      queue: { type: "string", short: "q" },
      type: { type: "string" },
      json: { type: "string" },
      id: { type: "string" },
      "delay-ms": { type: "string", default: "0" },
      "run-at-ms": { type: "string", default: "0" },
      "max-attempts": { type: "string", default: "25" },
      "schema-version": { type: "string", default: "1" },
      "print-sha": { type: "boolean", default: false },
    },
  });
  const script = loadScript();
  if (a["print-sha"]) {
    console.log(createHash("sha1").update(script).digest("hex"));
    return;
  }
  if (!a.queue || !a.type || a.json === undefined) throw new Error("usage: -q QUEUE --type TYPE --json JSON|- [--id ID]");
  const text = a.json === "-" ? readFileSync(0, "utf8") : a.json;
  const redis = new Redis(a.redis, { maxRetriesPerRequest: 1 });
  try {
    const r = await new Producer(redis, script).enqueue(a.queue, a.type, JSON.parse(text), {
      id: a.id, delayMs: Number(a["delay-ms"]), runAtMs: Number(a["run-at-ms"]),
      maxAttempts: Number(a["max-attempts"]), schemaVersion: Number(a["schema-version"]),
    });
    console.log(r.outcome === "duplicate" ? `duplicate ${r.id} state=${r.state}` : `${r.outcome} ${r.id}`);
  } finally {
    redis.disconnect();
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((e) => {
    console.error(`error: ${e.message}`);
    process.exit(2);
  });
}
