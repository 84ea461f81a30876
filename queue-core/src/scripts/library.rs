//! The queue-core function library: every script of this folder as one
//! Redis function (Redis 7 `FUNCTION LOAD`, called with `FCALL`), in one
//! library that holds the prelude once.
//!
//! Why not `EVALSHA` of prelude + body (as before issue #12): an `EVALSHA`
//! runs its whole chunk at every call, so each call re-created the prelude's
//! ~50 closures and tables before the first line of its own, and every
//! script kept its own compiled copy of the prelude in the Lua heap that
//! Redis's garbage collector walks. Measured with the real `fetch.lua` /
//! `ack.lua`, one job per call, every script loaded, on redis 7.0
//! (`examples/bench/script_modes.py --batch 1`): fetch 32.9 → 25.6 µs and
//! ack 27.8 → 19.2 µs of Redis time per call, EVALSHA → FCALL
//! (docs/BENCHMARKS.md, "Stop 25").
//!
//! The library is named `queue_core_<hash>` and each function
//! `qc_<hash>_<file stem>` (`qc_1a2b3c4d5e6f_ack`), the hash being the SHA1 of
//! the library's text: two versions of queue-core on one server (a rolling
//! deploy) each call their own functions, and a version's text never changes
//! under it. A call that finds the library missing (a new or restarted
//! server without persistence, a new primary that never had it, a
//! `FUNCTION FLUSH`) loads it and is sent again ([`super::Call::invoke`]).
//!
//! The load is single-flight: `FUNCTION LOAD` without `REPLACE` (one name
//! is one text, so a library already there is this one: "already exists"
//! is success, and Redis answers it before compiling anything), and one
//! load at a time per server in a process ([`LoadGate`]), whose outcome
//! every call that was in flight while it ran takes as its own. Before,
//! every call that found the library missing sent `FUNCTION LOAD REPLACE`
//! of the whole text (~225 KB): after a `FUNCTION FLUSH` or a restart
//! without persistence, 1,000 calls in flight made 1,000 loads, seconds of
//! Redis time that every other client waited behind, and 225 MB of
//! replication stream.
//!
//! In the library the prelude's locals live as long as the library, not one
//! call: every function starts with `call_begin()` (end of `prelude.lua`),
//! which resets the per-call caches.
//!
//! The same `.lua` files still run as `EVALSHA` scripts where a caller
//! needs that: producers in other languages (docs/PROTOCOL.md) and the
//! operator scripts of `admin/` (rare, and some take a variable key count).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Instant;

use redis::RedisResult;

use super::ScriptDef;
use crate::conn::RedisConnection;

/// The library text and the hash that names it.
struct Library {
    hash: String,
    text: String,
}

/// Stands for the hash while the text is hashed.
const HASH_MARK: &str = "@@LIBRARY_HASH@@";

static LIBRARY: LazyLock<Library> = LazyLock::new(build);

/// Every script of the library. A test checks that each `.lua` file of this
/// folder (but the prelude) is here; the header test of `mod.rs` reads them
/// from here too.
pub(super) fn defs() -> [&'static ScriptDef; 34] {
    use super::*;
    [
        &ack::SCRIPT.def,
        &announce::SCRIPT.def,
        &batch_add::SCRIPT.def,
        &batch_open::SCRIPT.def,
        &batch_seal::SCRIPT.def,
        &cancel::SCRIPT.def,
        &claim::SCRIPT.def,
        &cron_mark::SCRIPT.def,
        &dead_trim::SCRIPT.def,
        &defer::SCRIPT.def,
        &enqueue::SCRIPT.def,
        &enqueue_many::SCRIPT.def,
        &extend::SCRIPT.def,
        &fail::SCRIPT.def,
        &fetch::SCRIPT.def,
        &finish_cancel::SCRIPT.def,
        &group_pause::SCRIPT.def,
        &limits_read::SCRIPT.def,
        &lock_acquire::SCRIPT.def,
        &lock_extend::SCRIPT.def,
        &lock_release::SCRIPT.def,
        &pause::SCRIPT.def,
        &progress::SCRIPT.def,
        &promote::SCRIPT.def,
        &reclaim::SCRIPT.def,
        &relay_apply::SCRIPT.def,
        &relay_done::SCRIPT.def,
        &relay_retry::SCRIPT.def,
        &replay::SCRIPT.def,
        &result_wait::SCRIPT.def,
        &resume::SCRIPT.def,
        &set_limits::SCRIPT.def,
        &stats::SCRIPT.def,
        &step_record::SCRIPT.def,
    ]
}

/// The function name of script `file` (`ack.lua` -> `qc_<hash>_ack`).
pub(crate) fn function_name(file: &str) -> String {
    name_with(&LIBRARY.hash, file)
}

fn name_with(hash: &str, file: &str) -> String {
    format!("qc_{hash}_{}", file.trim_end_matches(".lua"))
}

/// The library's name on the server (`FUNCTION LIST`).
pub(crate) fn library_name() -> String {
    format!("queue_core_{}", LIBRARY.hash)
}

fn build() -> Library {
    let mut text = format!("#!lua name=queue_core_{HASH_MARK}\n{}\n", super::PRELUDE);
    for def in defs() {
        let flags: Vec<String> = def
            .flags
            .unwrap_or_default()
            .split(',')
            .filter(|f| !f.is_empty())
            .map(|f| format!("'{f}'"))
            .collect();
        let _ = write!(
            text,
            "redis.register_function{{function_name='{}', flags={{{}}}, callback=function(KEYS, ARGV)\n\
             call_begin()\n{}\nend}}\n",
            name_with(HASH_MARK, def.file),
            flags.join(", "),
            def.body
        );
    }
    // The SHA1 of the text with the mark in place of the hash.
    let full = redis::Script::new(&text).get_hash().to_string();
    let hash = full[..12].to_string();
    Library {
        text: text.replace(HASH_MARK, &hash),
        hash,
    }
}

/// One load of the library at a time for one server (all the connections of
/// the process to one URL share it: [`gate_for`]), and the outcome of the
/// last one: when it ended, and how.
#[derive(Default)]
pub(crate) struct LoadGate {
    last: tokio::sync::Mutex<Option<(Instant, RedisResult<()>)>>,
}

/// The gates of the servers this process talks to, by target (the URL
/// without credentials); an entry lives as long as a connection holds it.
static GATES: LazyLock<Mutex<HashMap<String, Weak<LoadGate>>>> = LazyLock::new(Default::default);

/// The gate of `target`, shared with every other connection to it.
pub(crate) fn gate_for(target: &str) -> Arc<LoadGate> {
    let mut gates = GATES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(gate) = gates.get(target).and_then(Weak::upgrade) {
        return gate;
    }
    gates.retain(|_, g| g.strong_count() > 0);
    let gate = Arc::new(LoadGate::default());
    gates.insert(target.to_string(), Arc::downgrade(&gate));
    gate
}

/// Loads the library, or takes the outcome of a load that ended after
/// `sent` (the moment the call that found it missing was sent: such a load
/// ran while the call was in flight, or after it, and answers for it too).
/// One load at a time per server ([`LoadGate`]): concurrent callers wait
/// for the one running, then take its outcome — an OOM refusal included
/// (the caller's `EVAL` fallback), and an error of the connection — instead
/// of each sending the ~225 KB text again.
pub(crate) async fn load_after(conn: &mut RedisConnection, sent: Instant) -> RedisResult<()> {
    let gate = conn.library_gate();
    let mut last = gate.last.lock().await;
    if let Some((ended, outcome)) = last.as_ref() {
        if *ended > sent {
            return outcome.clone();
        }
    }
    let outcome = load_text(conn).await;
    *last = Some((Instant::now(), outcome.clone()));
    outcome
}

/// Loads the library (through the gate: a load running meanwhile answers
/// for this one). On a cluster it goes to every primary.
#[cfg(test)]
pub(crate) async fn load(conn: &mut RedisConnection) -> RedisResult<()> {
    load_after(conn, Instant::now()).await
}

/// `FUNCTION LOAD` of the text, without `REPLACE`: a library of this name
/// holds this text (the name is the text's hash), so one already there is
/// success. Redis answers "already exists" before compiling the text, and
/// does not replicate the refusal: two processes racing to load it cost one
/// compile and one copy in the replication stream, not one each.
async fn load_text(conn: &mut RedisConnection) -> RedisResult<()> {
    match redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(LIBRARY.text.as_str())
        .query_async::<redis::Value>(conn)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_loaded_already(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `e` is Redis' "Library '<this library>' already exists".
fn is_loaded_already(e: &redis::RedisError) -> bool {
    e.to_string()
        .contains(&format!("Library '{}' already exists", library_name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_file_of_the_folder_is_in_the_library() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| f.ends_with(".lua") && f != "prelude.lua")
            .collect();
        files.sort();
        let mut listed: Vec<String> = defs().iter().map(|d| d.file.to_string()).collect();
        listed.sort();
        assert_eq!(listed, files, "add the script to library.rs defs()");
    }

    /// One name is one text (what lets a load skip `REPLACE`): the name's
    /// hash is that of the text with the hash marked out.
    #[test]
    fn names_carry_the_hash_of_the_text() {
        let marked = LIBRARY.text.replace(&LIBRARY.hash, HASH_MARK);
        assert_eq!(
            &redis::Script::new(&marked).get_hash()[..12],
            LIBRARY.hash.as_str()
        );
        assert_eq!(LIBRARY.hash.len(), 12);
        assert!(!LIBRARY.text.contains(HASH_MARK));
        assert_eq!(function_name("ack.lua"), format!("qc_{}_ack", LIBRARY.hash));
        assert!(LIBRARY
            .text
            .starts_with(&format!("#!lua name={}\n", library_name())));
    }

    /// The text compiles on a real server (Lua's limits: upvalues per
    /// function, locals per chunk) and registers one function per script.
    #[tokio::test]
    async fn the_library_loads_and_registers_every_script() {
        let (_server, mut conn) = crate::scripts::test_redis().await;
        load(&mut conn).await.unwrap();
        load(&mut conn).await.expect("loading it again is harmless");
        load_text(&mut conn)
            .await
            .expect("a library already there is success");
        let list: redis::Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(library_name())
            .query_async(&mut conn)
            .await
            .unwrap();
        let text = format!("{list:?}");
        for def in defs() {
            assert!(
                text.contains(&function_name(def.file)),
                "{} not registered: {text}",
                def.file
            );
        }
    }
}
