//! The typed script layer: every multi-key state change is one Lua script
//! (DESIGN rule 1, docs/DESIGN.md), and each script has one Rust wrapper
//! beside its `.lua` file.
//!
//! A wrapper takes typed keys and arguments (keys from [`QueueKeys`]),
//! builds the `EVALSHA` call, and decodes the reply into an enum in exactly
//! one place. Decoding never panics and never defaults a required field: a
//! missing or garbled field is a [`QueueError::Protocol`] naming the queue and
//! the job id.
//!
//! This module owns what all wrappers share: the prelude (`prelude.lua`,
//! prepended to every queue script), the script flags, [`LuaScript`] (a
//! compiled script whose key count is part of its type) and [`Call`] (one
//! invocation, run alone with a NOSCRIPT fallback or added to a pipeline).
//!
//! [`QueueKeys`]: crate::QueueKeys
//! [`QueueError::Protocol`]: crate::QueueError::Protocol

use std::sync::LazyLock;

use redis::{Cmd, Pipeline, RedisResult, Script, ToRedisArgs, Value};

use crate::conn::RedisConnection;
use crate::error::{QueueError, Result};
use crate::job::JobId;

pub(crate) mod library;
pub(crate) mod reply;

pub(crate) mod ack;
pub(crate) mod announce;
pub(crate) mod batch_add;
pub(crate) mod batch_open;
pub(crate) mod batch_seal;
pub(crate) mod cancel;
pub(crate) mod claim;
pub(crate) mod cron_mark;
pub(crate) mod dead_trim;
pub(crate) mod defer;
pub(crate) mod enqueue;
pub(crate) mod enqueue_many;
pub(crate) mod extend;
pub(crate) mod fail;
pub(crate) mod fetch;
pub(crate) mod finish_cancel;
pub(crate) mod group_pause;
pub(crate) mod limits_read;
pub(crate) mod lock_acquire;
pub(crate) mod lock_extend;
pub(crate) mod lock_release;
pub(crate) mod pause;
pub(crate) mod progress;
pub(crate) mod promote;
pub(crate) mod reclaim;
pub(crate) mod relay_apply;
pub(crate) mod relay_done;
pub(crate) mod relay_retry;
pub(crate) mod replay;
pub(crate) mod result_wait;
pub(crate) mod resume;
pub(crate) mod set_limits;
pub(crate) mod stats;
pub(crate) mod step_record;

#[cfg(test)]
mod enqueue_many_tests;
#[cfg(test)]
mod hardening;
#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod unlist_tests;
#[cfg(test)]
mod wf_hardening_tests;

#[cfg(test)]
mod cost;

const PRELUDE: &str = include_str!("prelude.lua");

/// Scripts that drain or maintain a queue must keep working when Redis is at
/// `maxmemory` with `noeviction`: draining is what frees memory. They only
/// move ids, shrink or rewrite small fields, so `allow-oom` cannot make
/// memory grow by much. Enqueue has no flag: at OOM it fails loudly.
pub(crate) const DRAIN: Option<&str> = Some("allow-oom");
/// Read-only scripts (stats) also run at OOM.
pub(crate) const READ_ONLY: Option<&str> = Some("no-writes,allow-oom");

/// The largest millisecond count a script takes: 2^53 − 1, the largest
/// integer a Lua number holds exactly (about 285,000 years; far below what
/// `PEXPIRE` and `SET … PX` accept on top of the Redis clock).
pub(crate) const MAX_MS: u64 = (1 << 53) - 1;

/// A duration as the millisecond argument of a script (or of `WAIT`),
/// clamped to [`MAX_MS`]: "keep for ever" (`Duration::MAX`) is the longest
/// time a script can keep. `as_millis() as u64` wrapped such a duration around to
/// an arbitrary count, which the ack turned into an immediate expiry of the
/// completion record (or a refused `SET`).
pub(crate) fn ms(d: std::time::Duration) -> u64 {
    d.as_millis().min(u128::from(MAX_MS)) as u64
}

/// A delivery's `far` flag as ack and fail send it: `"1"` when it was
/// claimed far from the tail of processing
/// ([`Delivery::far_from_tail`](claim::Delivery::far_from_tail)), `""`
/// otherwise. Only a hint for finding the delivery in processing
/// (`unlist_delivery` in the prelude).
pub(crate) fn far_arg(far_from_tail: bool) -> &'static str {
    if far_from_tail {
        "1"
    } else {
        ""
    }
}

/// The most bytes of a handler's error text the scripts store (the job's
/// `last_error`, its history, the event stream, a dead-letter reason, a
/// batch's failure detail). The prelude's `error_cut` cuts an argument the
/// same way, as a backstop.
pub(crate) const MAX_ERROR_BYTES: usize = 4096;

/// `message` as the scripts store it: whole when it has at most
/// [`MAX_ERROR_BYTES`] bytes, else cut at a character boundary and followed
/// by `… (<length> bytes)`, [`MAX_ERROR_BYTES`] in all. Uncut, a 1 MB error
/// went whole into the job hash, each of its 50 history entries and the
/// event stream (~10,000 entries) on every retry: Redis ran out of memory.
pub(crate) fn cut_error(message: &str) -> std::borrow::Cow<'_, str> {
    if message.len() <= MAX_ERROR_BYTES {
        return std::borrow::Cow::Borrowed(message);
    }
    let suffix = format!("… ({} bytes)", message.len());
    let mut end = MAX_ERROR_BYTES - suffix.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}{suffix}", &message[..end]))
}

/// Builds a queue script: an optional Redis 7 shebang line with flags, the
/// prelude, then the body.
pub(crate) fn with_prelude(flags: Option<&str>, body: &str) -> Script {
    Script::new(&with_prelude_text(flags, body))
}

/// The text of [`with_prelude`].
fn with_prelude_text(flags: Option<&str>, body: &str) -> String {
    match flags {
        Some(flags) => format!("#!lua flags={flags}\n{PRELUDE}\n{body}"),
        None => format!("{PRELUDE}\n{body}"),
    }
}

/// A Lua script taking exactly `KEYS` keys and `args` arguments, run as a
/// function of the queue-core library (`library.rs`).
///
/// `KEYS` is part of the type, so a wrapper cannot pass a different number of
/// keys; the unit test below checks it (and `args`) against the
/// `-- KEYS:` / `-- ARGV:` header of the `.lua` file.
pub(crate) struct LuaScript<const KEYS: usize> {
    /// What the library is built from: file, text, flags, prelude, counts.
    pub(crate) def: ScriptDef,
    /// The function's name in the library (`qc_<hash>_<file stem>`).
    pub(crate) function: LazyLock<String>,
}

/// One script as the library holds it.
pub(crate) struct ScriptDef {
    /// File name: `ack.lua`. Its stem names the function.
    pub(crate) file: &'static str,
    /// The `.lua` file's text, without the prelude.
    pub(crate) body: &'static str,
    /// Redis script flags, comma-separated (`allow-oom`, `no-writes`).
    pub(crate) flags: Option<&'static str>,
    /// Whether it was written against the prelude (`false`: a plain script;
    /// in the library it still sees the prelude, and uses none of it).
    /// Read by [`ScriptDef::eval_text`] only.
    pub(crate) prelude: bool,
    /// Number of `KEYS`: the `LuaScript`'s type parameter, here for the
    /// header test, which reads every script from the library's list.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) keys: usize,
    /// Number of `ARGV` entries.
    pub(crate) args: usize,
}

impl ScriptDef {
    /// The script as an `EVAL` text (prelude and shebang flags as before the
    /// library): what producers in other languages load by its SHA1
    /// (docs/PROTOCOL.md, sections 3 and 3a; checked by a test).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn eval_script(&self) -> Script {
        Script::new(&self.eval_text())
    }

    /// The text of [`eval_script`](Self::eval_script): a plain script's
    /// flags as its shebang line too, so that it runs as the library's
    /// function does (e.g. at OOM: [`Call::invoke`]).
    pub(crate) fn eval_text(&self) -> String {
        match (self.prelude, self.flags) {
            (true, flags) => with_prelude_text(flags, self.body),
            (false, Some(flags)) => format!("#!lua flags={flags}\n{}", self.body),
            (false, None) => self.body.to_string(),
        }
    }

    /// Whether Redis runs it at `maxmemory` (`allow-oom`, or `no-writes`
    /// which a full Redis also allows).
    fn runs_at_oom(&self) -> bool {
        self.flags
            .unwrap_or_default()
            .split(',')
            .any(|f| f == "allow-oom" || f == "no-writes")
    }
}

/// Declares a [`LuaScript`] from a `.lua` file beside the calling wrapper.
///
/// `lua_script!("ack.lua", keys = 6, args = 5, prelude(DRAIN))` for a queue
/// script written against the prelude (with optional flags);
/// `lua_script!("lock_extend.lua", keys = 1, args = 2, plain(None))` for a
/// script that uses none of it.
macro_rules! lua_script {
    ($file:literal, keys = $keys:literal, args = $args:literal, prelude($flags:expr)) => {
        $crate::scripts::lua_script!(@def $file, $keys, $args, $flags, true)
    };
    ($file:literal, keys = $keys:literal, args = $args:literal, plain($flags:expr)) => {
        $crate::scripts::lua_script!(@def $file, $keys, $args, $flags, false)
    };
    (@def $file:literal, $keys:literal, $args:literal, $flags:expr, $prelude:literal) => {
        $crate::scripts::LuaScript::<$keys> {
            def: $crate::scripts::ScriptDef {
                file: $file,
                body: include_str!($file),
                flags: $flags,
                prelude: $prelude,
                keys: $keys,
                args: $args,
            },
            function: ::std::sync::LazyLock::new(|| $crate::scripts::library::function_name($file)),
        }
    };
}
pub(crate) use lua_script;

impl<const KEYS: usize> LuaScript<KEYS> {
    /// Loads the library (`FUNCTION LOAD`), for tests that count a call's
    /// commands without the load (pipelines load it with
    /// `library::load_after`).
    #[cfg(test)]
    pub(crate) async fn load(&'static self, conn: &mut RedisConnection) -> RedisResult<()> {
        library::load(conn).await
    }

    /// Starts a call with its keys; add the arguments with [`Call::arg`].
    pub(crate) fn call<K: ToRedisArgs>(&'static self, keys: [K; KEYS]) -> Call {
        // Sized once for the header's keys and arguments (~48 bytes each):
        // grown from empty, the command's two buffers were reallocated and
        // copied ~10 times per call (issue #12, worker profile).
        let args = 3 + KEYS + self.def.args;
        let mut cmd = redis::Cmd::with_capacity(args, 48 * args);
        cmd.arg("FCALL").arg(self.function.as_str()).arg(KEYS);
        for key in keys {
            cmd.arg(key);
        }
        Call {
            def: &self.def,
            args: 0,
            cmd,
        }
    }
}

/// One invocation of a script: `FCALL <function> <KEYS> keys... args...`.
pub(crate) struct Call {
    def: &'static ScriptDef,
    args: usize,
    cmd: Cmd,
}

impl Call {
    /// Appends the next `ARGV` entry.
    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self.args += 1;
        self
    }

    /// Appends an entry of the repeated tail that follows the numbered
    /// `ARGV` of the header (e.g. `ack.lua`'s `id, token, result` per
    /// delivery): not counted against the header.
    pub(crate) fn repeated_arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    fn check_args(&self) {
        debug_assert_eq!(
            self.args, self.def.args,
            "{}: wrong number of arguments",
            self.def.file
        );
    }

    /// Runs the call: FCALL, and when the server does not have the library
    /// (first use on this server, after a restart without persistence, a
    /// `FUNCTION FLUSH`, a new primary that never had it) loads it and sends
    /// the call again. Nothing ran the first time, so the resend is safe.
    ///
    /// A full Redis (`maxmemory`, `noeviction`) refuses `FUNCTION LOAD`
    /// (OOM): a script that runs at OOM (`allow-oom`, `no-writes`: the ones
    /// that drain a queue) is then sent as an `EVAL` of its own text with the
    /// same flags, keys and arguments (the same reply), until memory allows a
    /// load. Without it, a process whose library was not loaded (a new
    /// version deployed into a full Redis, a `FUNCTION FLUSH`) could never
    /// drain the queue that would free the memory.
    ///
    /// The load is single-flight (`library::load_after`): the calls in
    /// flight when the library went missing wait for one load, then are
    /// sent again; before, each sent its own `FUNCTION LOAD REPLACE`.
    pub(crate) async fn invoke(&self, conn: &mut RedisConnection) -> RedisResult<Value> {
        self.check_args();
        let sent = std::time::Instant::now();
        match self.cmd.query_async(conn).await {
            Err(e) if is_unloaded(&e) => match library::load_after(conn, sent).await {
                Ok(()) => self.cmd.query_async(conn).await,
                Err(load) if load.code() == Some("OOM") && self.def.runs_at_oom() => {
                    self.eval(conn).await
                }
                Err(load) => Err(load),
            },
            other => other,
        }
    }

    /// The call as `EVALSHA` of the script's `EVAL` text (`EVAL` when the
    /// server does not have it cached): the `FCALL`'s key count, keys and
    /// arguments after the script.
    async fn eval(&self, conn: &mut RedisConnection) -> RedisResult<Value> {
        let text = self.def.eval_text();
        let with = |command: &str, script: &str| {
            let mut cmd = redis::cmd(command);
            cmd.arg(script);
            for arg in self.cmd.args_iter().skip(2) {
                if let redis::Arg::Simple(bytes) = arg {
                    cmd.arg(bytes);
                }
            }
            cmd
        };
        let sha = Script::new(&text).get_hash().to_string();
        match with("EVALSHA", &sha).query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                with("EVAL", &text).query_async(conn).await
            }
            other => other,
        }
    }

    /// [`invoke`](Self::invoke), with a failure as a [`QueueError`] naming
    /// the queue and job (DESIGN rule 8: every failure reaches the caller).
    pub(crate) async fn run(
        &self,
        conn: &mut RedisConnection,
        queue: &str,
        job_id: Option<&JobId>,
    ) -> Result<Value> {
        self.invoke(conn)
            .await
            .map_err(|e| QueueError::redis(queue, job_id, e))
    }

    /// Adds the call to a pipeline. The caller handles a missing library for
    /// the whole pipeline ([`is_unloaded`], `library::load_after`, resend).
    pub(crate) fn add_to(self, pipe: &mut Pipeline) {
        self.check_args();
        pipe.add_command(self.cmd);
    }
}

/// True when the server lacks the script: the NOSCRIPT of an `EVALSHA`, or
/// the "Function not found" of an `FCALL` whose library is not loaded; for a
/// pipeline, when any of its commands failed so.
pub(crate) fn is_unloaded(e: &redis::RedisError) -> bool {
    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
        return true;
    }
    e.clone().into_server_errors().is_some_and(|errors| {
        errors.iter().any(|(_, err)| {
            err.details()
                .is_some_and(|d| d.starts_with("Function not found"))
        })
    })
}

/// A throwaway redis-server and a connection to it, for the crate's tests
/// (the scripts of this folder, and the lock's).
#[cfg(test)]
pub(crate) async fn test_redis() -> (queue_testkit::RedisServer, RedisConnection) {
    let server = queue_testkit::RedisServer::start().unwrap();
    let conn = crate::conn::connect(&server.url(), &Default::default())
        .await
        .unwrap();
    (server, conn)
}

/// One raw command's reply (tests: setting up or reading keys by hand).
#[cfg(test)]
pub(crate) async fn raw_cmd(conn: &mut RedisConnection, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await.unwrap()
}

/// [`raw_cmd`] whose reply is a string or nil.
#[cfg(test)]
pub(crate) async fn raw_text(conn: &mut RedisConnection, args: &[&str]) -> Option<String> {
    match raw_cmd(conn, args).await {
        Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Value::Nil => None,
        other => panic!("{args:?}: {other:?}"),
    }
}

/// [`raw_cmd`] whose reply is an integer.
#[cfg(test)]
pub(crate) async fn raw_int(conn: &mut RedisConnection, args: &[&str]) -> i64 {
    match raw_cmd(conn, args).await {
        Value::Int(n) => n,
        other => panic!("{args:?}: {other:?}"),
    }
}

/// Starts the count of commands run (scripts' calls included) over:
/// `CONFIG RESETSTAT`, for [`command_calls`].
#[cfg(test)]
pub(crate) async fn reset_command_stats(conn: &mut RedisConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// How many times `cmd` ran since the last [`reset_command_stats`], scripts'
/// calls included (`INFO commandstats`).
#[cfg(test)]
pub(crate) async fn command_calls(conn: &mut RedisConnection, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    queue_testkit::command_stat(&info, cmd, "calls")
}

#[cfg(test)]
/// The commands scripts ran (`MONITOR` lines of the `lua` client)
/// while `run` ran, in order.
pub(crate) async fn script_commands<F: std::future::Future<Output = ()>>(
    url: &str,
    conn: &mut RedisConnection,
    run: F,
) -> Vec<String> {
    use futures::StreamExt;
    let client = redis::Client::open(url).unwrap();
    let monitor = client.get_async_monitor().await.unwrap();
    run.await;
    // Monitored after everything `run` sent: the end of its lines.
    let _: String = redis::cmd("ECHO")
        .arg("end-of-run")
        .query_async(conn)
        .await
        .unwrap();
    let mut lines = monitor.into_on_message::<String>();
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(60), lines.next());
        let line = next.await.expect("monitor lines").expect("monitor open");
        if line.contains("\"end-of-run\"") {
            return seen;
        }
        if line.contains(" lua] ") {
            seen.push(line);
        }
    }
}

#[cfg(test)]
/// The arguments of a `MONITOR` line (`… [0 lua] "LPOS" "key" "id"`),
/// the command first.
pub(crate) fn monitor_args(line: &str) -> Vec<String> {
    let Some(first) = line.find('"') else {
        return Vec::new();
    };
    line[first + 1..line.len() - 1]
        .split("\" \"")
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    /// The entries of a `-- KEYS:` or `-- ARGV:` header, which may continue
    /// on the following `--` lines that start with a number: `1 main`,
    /// `2 job hash (optional)`, ... (text after a comma inside an entry is
    /// an item of its own, without a number).
    fn header_items(body: &str, label: &str) -> Vec<String> {
        let mut text = String::new();
        let mut lines = body.lines();
        for line in lines.by_ref() {
            if let Some(rest) = line.strip_prefix(&format!("-- {label}:")) {
                text.push_str(rest);
                break;
            }
        }
        for line in lines {
            let Some(rest) = line.strip_prefix("--") else {
                break;
            };
            let rest = rest.trim_start();
            if rest.starts_with(|c: char| c.is_ascii_digit()) {
                text.push(',');
                text.push_str(rest);
            } else {
                break;
            }
        }
        text.split(',')
            .map(|item| item.trim().to_string())
            .collect()
    }

    /// The numbers of a header's entries: `1 main, 2 job hash, ...`.
    fn header_numbers(body: &str, label: &str) -> Vec<usize> {
        header_items(body, label)
            .iter()
            .filter_map(|item| item.split_whitespace().next()?.parse().ok())
            .collect()
    }

    /// The scripts that reach keys they do not declare: keys built from a
    /// prefix, a declared key's name or a job's fields (job hashes and
    /// completion records of other ids, group lists and the ring, a batch's
    /// keys, histories and events, waiters' wake lists, rate-limit logs). Each
    /// declares its queue's `guard` key (never written, keys.rs), so Redis
    /// Cluster refuses it whole while its slot migrates instead of letting it
    /// stop at the first undeclared key that moved, after its earlier writes
    /// (docs/SCALE-OUT.md, "Live resharding"). A script not listed reaches
    /// only the keys it declares. `admin/` scripts included.
    const GUARDED: [&str; 31] = [
        "ack.lua",
        "batch_open.lua",
        "batch_seal.lua",
        "cancel.lua",
        "claim.lua",
        "dead_trim.lua",
        "defer.lua",
        "enqueue.lua",
        "enqueue_many.lua",
        "fail.lua",
        "fetch.lua",
        "finish_cancel.lua",
        "limits_read.lua",
        "promote.lua",
        "reclaim.lua",
        "relay_apply.lua",
        "replay.lua",
        "result_wait.lua",
        "set_limits.lua",
        "stats.lua",
        // admin/
        "batch.lua",
        "batch_members.lua",
        "batches.lua",
        "check.lua",
        "dead_scan.lua",
        "delayed.lua",
        "health.lua",
        "processing.lua",
        "purge.lua",
        "repair_orphan.lua",
        "waiting.lua",
    ];

    /// The `admin/` scripts (sent as `EVALSHA`, not in the library).
    const ADMIN: [(&str, &str); 15] = [
        ("batch.lua", include_str!("../admin/batch.lua")),
        (
            "batch_members.lua",
            include_str!("../admin/batch_members.lua"),
        ),
        ("batches.lua", include_str!("../admin/batches.lua")),
        ("check.lua", include_str!("../admin/check.lua")),
        ("dead_scan.lua", include_str!("../admin/dead_scan.lua")),
        ("delayed.lua", include_str!("../admin/delayed.lua")),
        ("health.lua", include_str!("../admin/health.lua")),
        ("locate.lua", include_str!("../admin/locate.lua")),
        ("processing.lua", include_str!("../admin/processing.lua")),
        ("purge.lua", include_str!("../admin/purge.lua")),
        (
            "repair_group.lua",
            include_str!("../admin/repair_group.lua"),
        ),
        (
            "repair_lease.lua",
            include_str!("../admin/repair_lease.lua"),
        ),
        (
            "repair_missing.lua",
            include_str!("../admin/repair_missing.lua"),
        ),
        (
            "repair_orphan.lua",
            include_str!("../admin/repair_orphan.lua"),
        ),
        ("waiting.lua", include_str!("../admin/waiting.lua")),
    ];

    #[test]
    fn the_scripts_that_reach_undeclared_keys_declare_the_guard() {
        let library = super::library::defs().map(|d| (d.file, d.body));
        for (file, body) in library.iter().chain(&ADMIN) {
            // A numbered KEYS entry naming the guard (`5 guard (never ...`).
            let guard = header_items(body, "KEYS").into_iter().find(|item| {
                item.starts_with(|c: char| c.is_ascii_digit()) && item.contains("guard")
            });
            assert_eq!(
                guard.is_some(),
                GUARDED.contains(file),
                "{file}: declares the guard key ({guard:?}) but is not in GUARDED, or the reverse"
            );
        }
        for file in GUARDED {
            assert!(
                library.iter().chain(&ADMIN).any(|(f, _)| *f == file),
                "{file} is no script"
            );
        }
    }

    #[test]
    fn wrappers_declare_the_key_and_argument_counts_of_their_lua_headers() {
        for def in super::library::defs() {
            let (file, body, keys, args) = (def.file, def.body, def.keys, def.args);
            let declared = header_numbers(body, "KEYS");
            assert_eq!(
                declared,
                (1..=keys).collect::<Vec<_>>(),
                "{file}: the `-- KEYS:` header does not match the wrapper's {keys} keys"
            );
            let declared = header_numbers(body, "ARGV");
            assert_eq!(
                declared,
                (1..=args).collect::<Vec<_>>(),
                "{file}: the `-- ARGV:` header does not match the wrapper's {args} arguments"
            );
        }
    }

    /// The `EVAL` form of a call (a full Redis that lacks the library:
    /// `Call::invoke`) answers as its `FCALL` does, for a plain script and a
    /// prelude one, sent as `EVAL` (not cached yet) and as `EVALSHA`.
    #[tokio::test]
    async fn a_call_sent_as_eval_answers_as_its_function() {
        let (_server, mut conn) = super::test_redis().await;
        let keys = crate::keys::QueueKeys::new("same");
        let lock = crate::keys::LockKeys::new("held").lock;
        let _: () = redis::cmd("SET")
            .arg(&lock)
            .arg("token-1")
            .query_async(&mut conn)
            .await
            .unwrap();
        let calls = [
            super::lock_release::SCRIPT
                .call(["lock:held"])
                .arg("token-2"),
            super::promote::SCRIPT
                .call([
                    &keys.delayed,
                    &keys.main,
                    &keys.dead,
                    &keys.stats,
                    &keys.guard,
                    &keys.processing,
                    &keys.leases,
                ])
                .arg(&keys.job_prefix)
                .arg(10)
                .arg(&keys.done_prefix),
        ];
        for call in calls {
            let by_function = call.invoke(&mut conn).await.unwrap();
            assert_eq!(call.eval(&mut conn).await.unwrap(), by_function, "EVAL");
            assert_eq!(call.eval(&mut conn).await.unwrap(), by_function, "EVALSHA");
        }
    }

    #[tokio::test]
    async fn a_missing_function_is_told_apart_alone_and_in_a_pipeline() {
        let (_server, mut conn) = super::test_redis().await;
        let alone = redis::cmd("FCALL")
            .arg("qc_none_x")
            .arg(0)
            .query_async::<redis::Value>(&mut conn)
            .await
            .unwrap_err();
        assert!(super::is_unloaded(&alone), "{alone}");
        let mut pipe = redis::pipe();
        pipe.cmd("PING").cmd("FCALL").arg("qc_none_x").arg(0);
        let piped = pipe
            .query_async::<Vec<redis::Value>>(&mut conn)
            .await
            .unwrap_err();
        assert!(super::is_unloaded(&piped), "{piped}");
        let other = redis::cmd("LPUSH")
            .arg("k")
            .query_async::<redis::Value>(&mut conn)
            .await
            .unwrap_err();
        assert!(!super::is_unloaded(&other), "{other}");
    }

    /// `INFO commandstats` of `FUNCTION LOAD`: (calls, failed_calls,
    /// rejected_calls) since the last `CONFIG RESETSTAT`.
    async fn function_loads(conn: &mut crate::conn::RedisConnection) -> (u64, u64, u64) {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .unwrap();
        let stat = |field| queue_testkit::command_stat(&info, "function|load", field);
        (stat("calls"), stat("failed_calls"), stat("rejected_calls"))
    }

    /// 50 calls in flight on clones of one connection when the library goes
    /// missing (`FUNCTION FLUSH`; a restart without persistence, a new
    /// version's first calls): each finds it missing, one load runs, and
    /// each call is sent again and answers. Before, every call sent its own
    /// `FUNCTION LOAD REPLACE` of the whole library: 50 loads, each a compile
    /// of ~225 KB of Lua that every other client waited behind and a copy in
    /// the replication stream.
    /// `pause.lua` for each queue of `keys`, all sent at once on clones of
    /// `conn`: calls in flight together when the library is missing.
    async fn pause_each_at_once(
        conn: &crate::conn::RedisConnection,
        keys: &[crate::keys::QueueKeys],
    ) -> Vec<redis::RedisResult<redis::Value>> {
        let calls = keys.iter().map(|k| {
            let mut conn = conn.clone();
            async move {
                super::pause::SCRIPT
                    .call([k.paused()])
                    .invoke(&mut conn)
                    .await
            }
        });
        futures::future::join_all(calls).await
    }

    #[tokio::test]
    async fn calls_that_find_the_library_missing_share_one_load() {
        let (_server, mut conn) = super::test_redis().await;
        let keys: Vec<_> = (0..50)
            .map(|i| crate::keys::QueueKeys::new(&format!("herd{i}")))
            .collect();
        super::library::load(&mut conn).await.unwrap();
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        super::reset_command_stats(&mut conn).await;
        for reply in pause_each_at_once(&conn, &keys).await {
            reply.expect("each call answers after the load");
        }
        let (calls, failed, rejected) = function_loads(&mut conn).await;
        assert!(
            calls - failed <= 1,
            "{} successful loads (calls {calls}, failed {failed}, rejected {rejected})",
            calls - failed
        );
        assert!(calls + rejected <= 1, "one load sent: {calls} + {rejected}");
        for k in &keys {
            let paused: bool = redis::cmd("EXISTS")
                .arg(k.paused())
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(paused, "{}", k.queue);
        }
    }

    /// A process that finds the library there already (another process
    /// loaded it between its call and its load) loads nothing: the load
    /// without `REPLACE` answers "already exists", which is success, and
    /// the server compiles nothing (no successful load counted).
    #[tokio::test]
    async fn a_library_already_loaded_is_not_loaded_again() {
        let (_server, mut conn) = super::test_redis().await;
        super::library::load(&mut conn).await.unwrap();
        super::reset_command_stats(&mut conn).await;
        let mut other = crate::conn::connect(&_server.url(), &Default::default())
            .await
            .unwrap();
        super::library::load(&mut other)
            .await
            .expect("already there");
        let (calls, failed, _) = function_loads(&mut conn).await;
        assert_eq!((calls, failed), (1, 1), "refused as already there");
    }

    /// The same at `maxmemory` (`noeviction`): the one load is refused with
    /// OOM, every call that waited for it takes that refusal and a call that
    /// runs at OOM is sent as `EVAL` of its text (the queue still drains).
    #[tokio::test]
    async fn calls_that_find_the_library_missing_at_oom_share_the_refusal_and_run_as_eval() {
        let (_server, mut conn) = super::test_redis().await;
        let keys: Vec<_> = (0..20)
            .map(|i| crate::keys::QueueKeys::new(&format!("full{i}")))
            .collect();
        for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        super::reset_command_stats(&mut conn).await;
        for reply in pause_each_at_once(&conn, &keys).await {
            reply.expect("a call that runs at OOM answers as EVAL");
        }
        let (calls, failed, rejected) = function_loads(&mut conn).await;
        assert_eq!(calls - failed, 0, "nothing loaded at OOM");
        assert!(
            calls + rejected <= 1,
            "one load tried: {calls} + {rejected}"
        );
        let evals = super::command_calls(&mut conn, "eval").await
            + super::command_calls(&mut conn, "evalsha").await;
        assert!(evals >= 20, "{evals} EVAL / EVALSHA");
    }

    #[test]
    fn header_parser_reads_continued_lines() {
        let body = "-- KEYS: 1 a, 2 b\n-- ARGV: 1 x (y, z), 2 w,\n--       3 v\n-- Returns 1\n";
        assert_eq!(header_numbers(body, "KEYS"), vec![1, 2]);
        assert_eq!(header_numbers(body, "ARGV"), vec![1, 2, 3]);
    }
}
