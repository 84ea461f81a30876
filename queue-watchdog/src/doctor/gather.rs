//! What the doctor reads from the server: `INFO`, the `CONFIG GET` values
//! that decide durability, and the TTLs of queue keys and the lengths of
//! dead-letter lists (a bounded SCAN). These
//! are operator-only reads, not part of queue-core.

use std::collections::HashMap;

use queue_core::{ConnectionConfig, QueueKeys, RedisConnection};

use super::Facts;
use crate::error::{CliError, Result};

const CONFIG_KEYS: &[&str] = &[
    "appendonly",
    "appendfsync",
    "save",
    "maxmemory",
    "maxmemory-policy",
    "no-appendfsync-on-rewrite",
    "replica-read-only",
    "min-replicas-to-write",
    "min-replicas-max-lag",
    "stop-writes-on-bgsave-error",
];

/// Connects (error = exit 2) and reads INFO, CONFIG and the queue keys' TTLs.
pub async fn gather(url: &str, scan_limit: u64) -> Result<Facts> {
    let cfg = ConnectionConfig::default();
    let conn = RedisConnection::connect(url, &cfg).await?;
    if conn.is_cluster() {
        // The client routes INFO to every primary (a map, not one text) and
        // each SCAN to a node of its choice (cursors of different nodes
        // mixed): the answer would be about no server in particular.
        // Before, this failed as a decode error, read as "cannot reach
        // Redis".
        return Err(CliError::Other(
            "doctor checks one server's settings: run it against each primary's redis:// URL, \
             not a redis-cluster:// URL"
                .into(),
        ));
    }
    let mut c = conn.clone();
    let info: String = redis::cmd("INFO")
        .query_async(&mut c)
        .await
        .map_err(CliError::redis("INFO"))?;
    let mut facts = Facts {
        info: parse_info(&info),
        ..Facts::default()
    };
    for key in CONFIG_KEYS {
        let r: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(*key)
            .query_async(&mut c)
            .await;
        match r {
            Ok(pairs) => {
                for kv in pairs.chunks(2) {
                    if let [k, v] = kv {
                        facts.config.insert(k.clone(), v.clone());
                    }
                }
            }
            Err(e) => {
                facts.config_error = Some(e.to_string());
                break;
            }
        }
    }
    facts.libraries = libraries(&mut c).await;
    scan_ttls(&conn, scan_limit, &mut facts).await?;
    Ok(facts)
}

/// The names of the queue-core function libraries on the server; `None`
/// when `FUNCTION LIST` is not allowed (ACL) or not known (Redis < 7).
async fn libraries(c: &mut RedisConnection) -> Option<Vec<String>> {
    let list: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("queue_core_*")
        .query_async(&mut *c)
        .await
        .ok()?;
    Some(library_names(&list))
}

/// `library_name` of each entry of a `FUNCTION LIST` reply (RESP2: an array
/// of flat name/value arrays; RESP3: maps).
fn library_names(list: &redis::Value) -> Vec<String> {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(entries) = list else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .iter()
        .filter_map(|entry| match entry {
            Value::Array(kv) => kv
                .chunks(2)
                .find(|p| text(&p[0]).as_deref() == Some("library_name"))
                .and_then(|p| p.get(1).and_then(text)),
            Value::Map(kv) => kv
                .iter()
                .find(|(k, _)| text(k).as_deref() == Some("library_name"))
                .and_then(|(_, v)| text(v)),
            _ => None,
        })
        .collect();
    names.sort();
    names
}

/// `INFO` text → field map (`# Section` lines and blanks skipped).
pub fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// True when `key` is exactly the dead-letter list key of some queue
/// (`QueueKeys::dead`): `q:{`, a queue name an enqueue accepts, `}:dead`.
/// Not any key ending in `}:dead`: the job hash of id `order-7}:dead` is
/// `q:{x}:job:order-7}:dead`.
fn is_dead_list_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("q:{") else {
        return false;
    };
    let Some((queue, tail)) = rest.split_once('}') else {
        return false;
    };
    tail == ":dead"
        && queue_core::validate_queue_name(queue).is_ok()
        && QueueKeys::new(queue).dead == key
}

/// The lengths of the dead-letter lists `dead` into `facts.dead_lengths`.
/// A key of another type (`WRONGTYPE`: corrupt data, the queue's reclaims
/// and dead-letterings fail) goes to `facts.dead_wrong_type`, a finding:
/// each `LLEN` answers on its own, as one `WRONGTYPE` failed the whole
/// pipeline and the doctor with it (exit 2, "cannot connect"). Any other
/// refusal (`NOPERM`: an ACL without `LLEN`; `BUSY`: a script runs) says
/// nothing about the key: it goes to `facts.dead_unreadable`, a "could not
/// read" warning like an unreadable `CONFIG`. Before, every error was taken
/// for another type, and the doctor told the operator to rename a healthy
/// list.
async fn dead_lengths(c: &mut RedisConnection, dead: &[&String], facts: &mut Facts) -> Result<()> {
    let mut pipe = redis::pipe();
    for k in dead {
        pipe.cmd("LLEN").arg(*k);
    }
    let lens: Vec<redis::RedisResult<u64>> = pipe
        .ignore_errors()
        .query_async(&mut *c)
        .await
        .map_err(CliError::redis("LLEN of dead-letter lists"))?;
    for (k, len) in dead.iter().zip(lens) {
        match len {
            Ok(n) => facts.dead_lengths.push(((*k).clone(), n)),
            Err(e) if e.code() == Some("WRONGTYPE") => {
                let kind: redis::RedisResult<String> =
                    redis::cmd("TYPE").arg(*k).query_async(&mut *c).await;
                let kind = kind.unwrap_or_else(|_| "not a list".into());
                facts.dead_wrong_type.push(((*k).clone(), kind));
            }
            Err(e) => facts.dead_unreadable.push(((*k).clone(), e.to_string())),
        }
    }
    Ok(())
}

/// Keys of a queue that expire by design: completion records, step results,
/// per-minute throughput counters, fetch receipts.
async fn scan_ttls(conn: &RedisConnection, limit: u64, facts: &mut Facts) -> Result<()> {
    let mut c = conn.clone();
    let mut cursor = 0u64;
    let mut calls = 0u64;
    facts.scan_complete = true;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("q:{*}:*")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .map_err(CliError::redis("SCAN for queue keys"))?;
        calls += 1;
        let keys: Vec<String> = keys
            .into_iter()
            .filter(|k| !QueueKeys::expires_by_design(k))
            .collect();
        let dead: Vec<&String> = keys.iter().filter(|k| is_dead_list_key(k)).collect();
        if !dead.is_empty() {
            dead_lengths(&mut c, &dead, facts).await?;
        }
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for k in &keys {
                pipe.cmd("PTTL").arg(k);
            }
            let ttls: Vec<i64> = pipe
                .query_async(&mut c)
                .await
                .map_err(CliError::redis("PTTL of queue keys"))?;
            for (k, ttl) in keys.iter().zip(ttls) {
                if ttl >= 0 {
                    facts.ttl_count += 1;
                    if facts.ttl_keys.len() < 20 {
                        facts.ttl_keys.push((k.clone(), ttl));
                    }
                }
            }
        }
        facts.scanned += keys.len() as u64;
        cursor = next;
        if cursor == 0 {
            break;
        }
        // Bounded: the keys returned and the keyspace walked (COUNT 1000 per call).
        if facts.scanned >= limit || calls * 1000 >= limit.saturating_mul(10) {
            facts.scan_complete = false;
            break;
        }
    }
    Ok(())
}
