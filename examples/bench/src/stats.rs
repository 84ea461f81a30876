//! Measurement helpers: a lock-free latency histogram, Redis `INFO`
//! snapshots (commandstats, CPU, memory) and process RSS.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use serde_json::{json, Value};

/// Wall clock, microseconds since the Unix epoch. Producers and workers of
/// every system run on this one machine, so their wall clocks agree.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Log-linear histogram of `u64` values (microseconds): exact below 128,
/// then 64 sub-buckets per power of two (< 1.6 % error). Fixed size
/// (~30 KiB), lock-free, so recording costs the same at 1k or 1M jobs.
pub struct Hist {
    buckets: Vec<AtomicU64>,
}

const LINEAR: usize = 128;
const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;

impl Default for Hist {
    fn default() -> Self {
        Self::new()
    }
}

impl Hist {
    pub fn new() -> Self {
        let n = LINEAR + (64 - 7) * SUB;
        Hist {
            buckets: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn index(v: u64) -> usize {
        if v < LINEAR as u64 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= 7
        let shift = e - SUB_BITS;
        let sub = (v >> shift) as usize - SUB;
        LINEAR + (e as usize - 7) * SUB + sub
    }

    fn value(idx: usize) -> u64 {
        if idx < LINEAR {
            return idx as u64;
        }
        let e = ((idx - LINEAR) / SUB) as u32 + 7;
        let sub = ((idx - LINEAR) % SUB) as u64;
        let shift = e - SUB_BITS;
        let low = (SUB as u64 + sub) << shift;
        low + (1u64 << shift) / 2
    }

    pub fn record(&self, v: u64) {
        self.buckets[Self::index(v)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The value at quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let target = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= target {
                return Self::value(i);
            }
        }
        Self::value(self.buckets.len() - 1)
    }

    /// `{"p50_ms":..,"p99_ms":..,"p999_ms":..,"max_ms":..,"count":..}`.
    pub fn summary_ms(&self) -> Value {
        let ms = |us: u64| (us as f64 / 1000.0 * 1000.0).round() / 1000.0;
        json!({
            "count": self.count(),
            "p50_ms": ms(self.quantile(0.50)),
            "p99_ms": ms(self.quantile(0.99)),
            "p999_ms": ms(self.quantile(0.999)),
            "max_ms": ms(self.quantile(1.0)),
        })
    }
}

/// Per-command counters of `INFO commandstats` plus server CPU and memory.
#[derive(Debug, Clone, Default)]
pub struct RedisSnapshot {
    /// command -> (calls, usec)
    pub cmds: BTreeMap<String, (u64, u64)>,
    pub cpu_s: f64,
    pub used_memory: u64,
}

pub async fn snapshot(conn: &mut ConnectionManager) -> redis::RedisResult<RedisSnapshot> {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut snap = RedisSnapshot::default();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let mut calls = 0;
        let mut usec = 0;
        for kv in fields.split(',') {
            match kv.split_once('=') {
                Some(("calls", v)) => calls = v.parse().unwrap_or(0),
                Some(("usec", v)) => usec = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        snap.cmds.insert(name.to_string(), (calls, usec));
    }
    let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    for line in cpu.lines() {
        if let Some(v) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            snap.cpu_s += v.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    let mem: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    for line in mem.lines() {
        if let Some(v) = line.strip_prefix("used_memory:") {
            snap.used_memory = v.trim().parse().unwrap_or(0);
        }
    }
    Ok(snap)
}

/// The commands that run a script: `EVALSHA`, `EVAL`, `FCALL`, `FCALL_RO`.
pub const SCRIPT_COMMANDS: [&str; 4] = ["evalsha", "eval", "fcall", "fcall_ro"];

impl RedisSnapshot {
    /// Calls of `cmd` between `before` and `self`.
    pub fn calls_since(&self, before: &RedisSnapshot, cmd: &str) -> u64 {
        let now = self.cmds.get(cmd).map(|c| c.0).unwrap_or(0);
        let then = before.cmds.get(cmd).map(|c| c.0).unwrap_or(0);
        now.saturating_sub(then)
    }

    /// Usec Redis spent in `cmd` between `before` and `self`.
    pub fn usec_since(&self, before: &RedisSnapshot, cmd: &str) -> u64 {
        let now = self.cmds.get(cmd).map(|c| c.1).unwrap_or(0);
        let then = before.cmds.get(cmd).map(|c| c.1).unwrap_or(0);
        now.saturating_sub(then)
    }

    /// Script calls between `before` and `self`: `EVALSHA`/`EVAL` (peers, a
    /// queue-core build from before the function library, its admin
    /// scripts) and `FCALL`/`FCALL_RO` (queue-core's function library).
    pub fn script_calls_since(&self, before: &RedisSnapshot) -> u64 {
        SCRIPT_COMMANDS
            .iter()
            .map(|c| self.calls_since(before, c))
            .sum()
    }

    /// Usec Redis spent in script calls (as [`Self::script_calls_since`]),
    /// the commands they ran included.
    pub fn script_usec_since(&self, before: &RedisSnapshot) -> u64 {
        SCRIPT_COMMANDS
            .iter()
            .map(|c| self.usec_since(before, c))
            .sum()
    }

    /// The commands a queue-core client sends itself (never from inside a
    /// script), per job, and the breakdown of the script calls by script, told
    /// apart by a command only that script runs inside Redis: claim.lua runs
    /// LPOS, promote.lua ZRANGEBYSCORE, ack.lua one INCRBY per call (its
    /// per-minute throughput counter); the rest are fetches.
    ///
    /// `enqueued` and `acked` are the jobs enqueued and acked in the window.
    pub fn queue_core_calls(
        &self,
        before: &RedisSnapshot,
        jobs: u64,
        enqueued: u64,
        acked: u64,
        seconds: f64,
    ) -> Value {
        let d = |c: &str| self.calls_since(before, c);
        let per = |x: u64| {
            if jobs == 0 {
                0.0
            } else {
                round3(x as f64 / jobs as f64)
            }
        };
        let scripts = self.script_calls_since(before);
        let blmove = d("blmove");
        let claims = d("lpos");
        let promotes = d("zrangebyscore");
        // Acks are batched (one ack.lua call for many jobs): until stop 26
        // this counted one ack call per acked job, so "fetch" scripts were
        // the ack calls and "jobs per fetch script" was jobs per ack call.
        let ack_calls = d("incrby");
        // Enqueue calls: enqueue.lua and enqueue_many.lua (group commit and
        // batches: many jobs per call) each run one HINCRBY of `enqueued`,
        // ack.lua one of `completed`; rarer counters (dead, retried) add noise.
        let enqueue_calls = d("hincrby").saturating_sub(ack_calls).min(enqueued);
        // Jobs delivered by fetch scripts: all acked jobs but those that came
        // through BLMOVE + claim. (LMOVE calls would also count the final
        // LMOVE that found the queue empty.)
        let fetched_by_script = acked.saturating_sub(claims);
        let fetch_scripts = scripts.saturating_sub(enqueue_calls + ack_calls + claims + promotes);
        // What queue-core's clients send: script calls, the fetcher's BLMOVE
        // and the promoter's BLPOP (its only plain commands on the hot path;
        // the idle fetcher's one EXISTS per block timeout is left out). Until
        // stop 25 this was "every command minus a list of those the scripts
        // run", and the list missed LRANGE, RPUSH, TYPE, GET, INCRBY, ZRANGE
        // …: it counted ~1.5–2 commands run inside scripts per job as the
        // client's.
        let all: u64 = self.cmds.keys().map(|k| d(k)).sum();
        let top_level = scripts + blmove + d("blpop");
        let usec = self.script_usec_since(before) + self.usec_since(before, "blmove");
        json!({
            "evalsha_per_job": per(scripts),
            "blmove_per_job": per(blmove),
            "top_level_cmds_per_job": per(top_level),
            "all_cmds_per_job": per(all.saturating_sub(d("info"))),
            "scripts": {
                "enqueue": enqueue_calls, "enqueued": enqueued, "fetch": fetch_scripts, "claim_after_blmove": claims,
                "ack": ack_calls, "acked": acked, "promote": promotes, "blmove": blmove,
                "jobs_per_ack_script": if ack_calls == 0 { 0.0 } else { round3(acked as f64 / ack_calls as f64) },
                "jobs_per_fetch_script": if fetch_scripts == 0 { 0.0 } else { round3(fetched_by_script as f64 / fetch_scripts as f64) },
                "promote_per_s": if seconds > 0.0 { round3(promotes as f64 / seconds) } else { 0.0 },
            },
            "redis_usec_per_job": per(usec),
        })
    }

    pub fn cpu_since(&self, before: &RedisSnapshot) -> f64 {
        round3(self.cpu_s - before.cpu_s)
    }
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `VmRSS` and `VmHWM` (peak) of a process, in KiB.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// User+system CPU seconds used by this process so far.
pub fn self_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the `(comm)`: state is field 3; utime 14, stime 15.
    let Some(after) = stat.rsplit_once(')').map(|(_, a)| a) else {
        return 0.0;
    };
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // `after` starts at field 3, so field k is f[k - 3].
    (ticks(11) + ticks(12)) / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 jobs through group-committed enqueues (10 calls of 10), fetches
    /// of 25 and acks of 50: each script told apart by the command only it
    /// runs once per call (until stop 26 every acked or enqueued job counted
    /// as one script call, and the fetches came out as 0).
    #[test]
    fn script_calls_are_split_by_the_command_each_runs_once() {
        let before = RedisSnapshot::default();
        let mut after = RedisSnapshot::default();
        for (cmd, calls) in [("fcall", 16), ("hincrby", 12), ("incrby", 2), ("hset", 200)] {
            after.cmds.insert(cmd.to_string(), (calls, 0));
        }
        let v = after.queue_core_calls(&before, 100, 100, 100, 1.0);
        let s = &v["scripts"];
        assert_eq!(s["enqueue"], 10);
        assert_eq!(s["ack"], 2);
        assert_eq!(s["fetch"], 4);
        assert_eq!(s["jobs_per_fetch_script"], 25.0);
        assert_eq!(s["jobs_per_ack_script"], 50.0);
    }

    #[test]
    fn histogram_quantiles_are_close() {
        let h = Hist::new();
        for v in 1..=100_000u64 {
            h.record(v);
        }
        for (q, want) in [(0.5, 50_000.0), (0.99, 99_000.0), (0.999, 99_900.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.02, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.count(), 100_000);
        let small = Hist::new();
        small.record(3);
        assert_eq!(small.quantile(0.5), 3);
    }

    #[test]
    fn index_and_value_round_trip() {
        for v in [0u64, 1, 127, 128, 129, 1000, 65_535, 1 << 40, u64::MAX / 2] {
            let back = Hist::value(Hist::index(v));
            assert!(
                back as f64 >= v as f64 * 0.98 && back as f64 <= v as f64 * 1.02 + 1.0,
                "{v} -> {back}"
            );
        }
    }
}
