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

pub(crate) mod reply;

pub(crate) mod ack;
pub(crate) mod announce;
pub(crate) mod batch_add;
pub(crate) mod batch_open;
pub(crate) mod batch_seal;
pub(crate) mod cancel;
pub(crate) mod claim;
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
mod cost;

const PRELUDE: &str = include_str!("prelude.lua");

/// Scripts that drain or maintain a queue must keep working when Redis is at
/// `maxmemory` with `noeviction`: draining is what frees memory. They only
/// move ids, shrink or rewrite small fields, so `allow-oom` cannot make
/// memory grow by much. Enqueue has no flag: at OOM it fails loudly.
pub(crate) const DRAIN: Option<&str> = Some("allow-oom");
/// Read-only scripts (stats) also run at OOM.
pub(crate) const READ_ONLY: Option<&str> = Some("no-writes,allow-oom");

/// Builds a queue script: an optional Redis 7 shebang line with flags, the
/// prelude, then the body.
pub(crate) fn with_prelude(flags: Option<&str>, body: &str) -> Script {
    match flags {
        Some(flags) => Script::new(&format!("#!lua flags={flags}\n{PRELUDE}\n{body}")),
        None => Script::new(&format!("{PRELUDE}\n{body}")),
    }
}

/// A Lua script taking exactly `KEYS` keys and `args` arguments.
///
/// `KEYS` is part of the type, so a wrapper cannot pass a different number of
/// keys; the unit test below checks it (and `args`) against the
/// `-- KEYS:` / `-- ARGV:` header of the `.lua` file.
pub(crate) struct LuaScript<const KEYS: usize> {
    /// File name, for messages.
    pub(crate) file: &'static str,
    /// The `.lua` file's text, without the prelude (read by the header test).
    #[cfg(test)]
    pub(crate) body: &'static str,
    /// Number of `ARGV` entries.
    pub(crate) args: usize,
    /// The compiled script (prelude and flags included).
    pub(crate) script: LazyLock<Script>,
}

/// Declares a [`LuaScript`] from a `.lua` file beside the calling wrapper.
///
/// `lua_script!("ack.lua", keys = 6, args = 5, prelude(DRAIN))` for a queue
/// script (the prelude is prepended, with optional flags);
/// `lua_script!("lock_extend.lua", keys = 1, args = 2, plain)` for a script
/// that runs as written.
macro_rules! lua_script {
    ($file:literal, keys = $keys:literal, args = $args:literal, prelude($flags:expr)) => {
        $crate::scripts::LuaScript::<$keys> {
            file: $file,
            #[cfg(test)]
            body: include_str!($file),
            args: $args,
            script: ::std::sync::LazyLock::new(|| {
                $crate::scripts::with_prelude($flags, include_str!($file))
            }),
        }
    };
    ($file:literal, keys = $keys:literal, args = $args:literal, plain) => {
        $crate::scripts::LuaScript::<$keys> {
            file: $file,
            #[cfg(test)]
            body: include_str!($file),
            args: $args,
            script: ::std::sync::LazyLock::new(|| ::redis::Script::new(include_str!($file))),
        }
    };
}
pub(crate) use lua_script;

impl<const KEYS: usize> LuaScript<KEYS> {
    /// Loads the script (`SCRIPT LOAD`), e.g. after a pipeline got NOSCRIPT.
    pub(crate) async fn load(&'static self, conn: &mut RedisConnection) -> RedisResult<()> {
        self.script.load_async(conn).await.map(drop)
    }

    /// The number of keys (`KEYS`), for the header test.
    #[cfg(test)]
    pub(crate) fn key_count(&self) -> usize {
        KEYS
    }

    /// Starts a call with its keys; add the arguments with [`Call::arg`].
    pub(crate) fn call<K: ToRedisArgs>(&'static self, keys: [K; KEYS]) -> Call {
        let script: &'static Script = &self.script;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(KEYS);
        for key in keys {
            cmd.arg(key);
        }
        Call {
            script,
            file: self.file,
            expected_args: self.args,
            args: 0,
            cmd,
        }
    }
}

/// One invocation of a script: `EVALSHA <sha> <KEYS> keys... args...`.
pub(crate) struct Call {
    script: &'static Script,
    file: &'static str,
    expected_args: usize,
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
            self.args, self.expected_args,
            "{}: wrong number of arguments",
            self.file
        );
    }

    /// Runs the call: EVALSHA, and on NOSCRIPT (first use on this server, or
    /// after a restart) loads the script and sends it again.
    pub(crate) async fn invoke(&self, conn: &mut RedisConnection) -> RedisResult<Value> {
        self.check_args();
        match self.cmd.query_async(conn).await {
            Err(e) if is_noscript(&e) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
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

    /// Adds the call to a pipeline. The caller handles NOSCRIPT for the whole
    /// pipeline with [`LuaScript::load`] and a resend.
    pub(crate) fn add_to(self, pipe: &mut Pipeline) {
        self.check_args();
        pipe.add_command(self.cmd);
    }
}

/// True for the NOSCRIPT error of an EVALSHA whose script is not loaded.
pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    /// (file, .lua text, KEYS of the wrapper, ARGV of the wrapper).
    fn all() -> Vec<(&'static str, &'static str, usize, usize)> {
        macro_rules! entry {
            ($m:ident) => {
                (
                    super::$m::SCRIPT.file,
                    super::$m::SCRIPT.body,
                    super::$m::SCRIPT.key_count(),
                    super::$m::SCRIPT.args,
                )
            };
        }
        vec![
            entry!(ack),
            entry!(announce),
            entry!(batch_add),
            entry!(batch_open),
            entry!(batch_seal),
            entry!(cancel),
            entry!(claim),
            entry!(dead_trim),
            entry!(defer),
            entry!(enqueue),
            entry!(enqueue_many),
            entry!(extend),
            entry!(fail),
            entry!(fetch),
            entry!(finish_cancel),
            entry!(limits_read),
            entry!(group_pause),
            entry!(lock_acquire),
            entry!(lock_extend),
            entry!(lock_release),
            entry!(pause),
            entry!(progress),
            entry!(promote),
            entry!(reclaim),
            entry!(relay_apply),
            entry!(relay_done),
            entry!(replay),
            entry!(result_wait),
            entry!(resume),
            entry!(set_limits),
            entry!(stats),
            entry!(step_record),
        ]
    }

    /// The numbered entries of a `-- KEYS:` or `-- ARGV:` header, which may
    /// continue on the following `--` lines: `1 main, 2 job hash, ...`.
    fn header_numbers(body: &str, label: &str) -> Vec<usize> {
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
            .filter_map(|item| item.split_whitespace().next()?.parse().ok())
            .collect()
    }

    #[test]
    fn wrappers_declare_the_key_and_argument_counts_of_their_lua_headers() {
        for (file, body, keys, args) in all() {
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

    #[test]
    fn header_parser_reads_continued_lines() {
        let body = "-- KEYS: 1 a, 2 b\n-- ARGV: 1 x (y, z), 2 w,\n--       3 v\n-- Returns 1\n";
        assert_eq!(header_numbers(body, "KEYS"), vec![1, 2]);
        assert_eq!(header_numbers(body, "ARGV"), vec![1, 2, 3]);
    }
}
