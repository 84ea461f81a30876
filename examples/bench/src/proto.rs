//! A stripped-down consumer that runs queue-core's *own* fetch and ack
//! scripts (compiled in from `queue-core/src/scripts`, sent as EVALSHA with
//! the prelude) with today's keys and arguments, acking either one `ack.lua`
//! call per job or one call per fetched batch (as the `Worker`'s acker does).
//! It measures what batched acks gain and how much the `Worker` machinery
//! costs on top of the Redis protocol. A measuring tool for
//! docs/BENCHMARKS.md, not a worker: no heartbeats, retries or shutdown
//! handling. (Before stop 29 it drove stop 20's signatures and a prototype
//! `ack_many.lua`, and failed against the current scripts.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use queue_core::QueueKeys;
use redis::{Script, Value};
use serde_json::{json, Value as Json};

use crate::stats::{self, round3};
use crate::{Noop, Res};

const PRELUDE: &str = include_str!("../../../queue-core/src/scripts/prelude.lua");
const FETCH: &str = include_str!("../../../queue-core/src/scripts/fetch.lua");
/// A claimed job: id, token, and the fields its ack sends back: for the
/// completion record (attempts, type, enqueued_at, delivered_at), and its
/// claim row's `far` flag.
type Claimed = (Vec<u8>, Vec<u8>, Vec<Vec<u8>>);

const ACK: &str = include_str!("../../../queue-core/src/scripts/ack.lua");

/// The lease of each claimed job (ms); the receipt lives half of it.
const LEASE_MS: u64 = 30_000;
/// The completion records' retention (ms): the library's default, 24 h.
const RETENTION_MS: u64 = 24 * 3600 * 1000;

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

/// The fields of a claimed row (one string: each field its length in
/// decimal, `:` and its bytes; `claimed_row` in prelude.lua): id, token,
/// type, v, attempts, max_attempts, enqueued_at, delivered_at, fence,
/// traceparent, first_started_at, far, payload. `None` when it does not
/// split.
fn claimed_fields(row: &[u8]) -> Option<Vec<&[u8]>> {
    let mut fields = Vec::with_capacity(13);
    let mut rest = row;
    while !rest.is_empty() {
        let colon = rest.iter().position(|&b| b == b':')?;
        let len: usize = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
        let field = rest.get(colon + 1..colon + 1 + len)?;
        fields.push(field);
        rest = &rest[colon + 1 + len..];
    }
    (fields.len() == 13).then_some(fields)
}

/// Runs `n` preloaded jobs through `fetchers` loops that each fetch up to
/// `batch` jobs, decode them, and ack them (`batched_ack`: one call).
pub async fn run(url: &str, n: u64, fetchers: usize, batch: usize, batched_ack: bool) -> Res<Json> {
    let keys = QueueKeys::new(crate::QUEUE);
    let client = redis::Client::open(url)?;
    let conn = client.get_multiplexed_async_connection().await?;
    let mut admin = crate::admin(url).await?;
    let (fetch, ack) = (script(FETCH), script(ACK));
    let done = Arc::new(AtomicU64::new(0));
    let before = stats::snapshot(&mut admin).await?;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for f in 0..fetchers {
        let (mut conn, keys, fetch, ack, done) = (
            conn.clone(),
            keys.clone(),
            fetch.clone(),
            ack.clone(),
            done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut round = 0u64;
            loop {
                round += 1;
                let token_base = format!("proto-{f}-{round}");
                let reply: Value = fetch
                    .key(&keys.main)
                    .key(&keys.processing)
                    .key(&keys.leases)
                    .key(&keys.dead)
                    .key(&keys.stats)
                    .key(&keys.guard)
                    .key(keys.fetch_receipt(&token_base))
                    .key(keys.paused())
                    .key(keys.limits())
                    .key(&keys.delayed)
                    .key(&keys.wake)
                    .arg(&keys.job_prefix)
                    .arg(&keys.done_prefix)
                    .arg(LEASE_MS)
                    .arg(&token_base)
                    .arg(batch)
                    .arg(LEASE_MS / 2)
                    .arg("proto")
                    .arg("1") // a fresh token base: its first try reads no receipt
                    .invoke_async(&mut conn)
                    .await?;
                let Value::Array(rows) = reply else {
                    return Err::<(), crate::BoxError>("fetch reply".into());
                };
                if rows.is_empty() {
                    return Ok(());
                }
                let mut claimed = Vec::new();
                for row in rows {
                    // Rows of other outcomes are arrays: nothing to run.
                    let Value::BulkString(packed) = row else {
                        continue;
                    };
                    let Some(f) = claimed_fields(&packed) else {
                        continue;
                    };
                    let (id, token) = (f[0].to_vec(), f[1].to_vec());
                    // "Run" the job: decode its payload like the worker does.
                    let _args: Noop = rmp_serde::from_slice(f[12])?;
                    // The ack sends back what the claim answered: for the
                    // record attempts, type, enqueued_at, delivered_at; and
                    // the far flag.
                    let record: Vec<Vec<u8>> =
                        [4, 2, 6, 7, 11].iter().map(|&i| f[i].to_vec()).collect();
                    claimed.push((id, token, record));
                }
                // One ack.lua call for the batch, or one per job (in flight together).
                let groups: Vec<&[Claimed]> = match batched_ack {
                    true => vec![&claimed[..]],
                    false => claimed.chunks(1).collect(),
                };
                let acks = groups.into_iter().map(|group| {
                    let mut c = conn.clone();
                    let mut inv = ack.key(&keys.processing);
                    inv.key(&keys.leases).key(&keys.stats).key(&keys.guard);
                    inv.arg(&keys.job_prefix)
                        .arg(&keys.done_prefix)
                        .arg(&keys.steps_prefix)
                        .arg(RETENTION_MS)
                        .arg(&keys.tput_prefix)
                        .arg("hash")
                        .arg("proto");
                    for (id, token, record) in group {
                        inv.arg(id).arg(token).arg("").arg(record);
                    }
                    async move {
                        // One digit per delivery (ack.lua), 1: acked.
                        let codes: Vec<u8> = inv.invoke_async(&mut c).await?;
                        match codes.iter().all(|&code| code == b'1') {
                            true => Ok(()),
                            false => Err(crate::BoxError::from(format!("ack codes {codes:?}"))),
                        }
                    }
                });
                futures::future::try_join_all(acks).await?;
                done.fetch_add(claimed.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = t.elapsed().as_secs_f64();
    let after = stats::snapshot(&mut admin).await?;
    let processed = done.load(Ordering::Relaxed);
    let evalsha = after.script_calls_since(&before);
    Ok(json!({
        "workload": "proto", "n": n, "processed": processed, "fetchers": fetchers, "fetch_batch": batch,
        "ack": if batched_ack { "batched" } else { "one per job" },
        "seconds": round3(secs), "jobs_per_s": (processed as f64 / secs).round(),
        "evalsha_per_job": round3(evalsha as f64 / processed.max(1) as f64),
        "redis_cpu_util": round3(after.cpu_since(&before) / secs),
        "client_cpu_s": round3(stats::self_cpu_s()),
    }))
}
