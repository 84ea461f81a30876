//! The Lua scripts. Each multi-key state change is one script, run with
//! EVALSHA and a fallback to EVAL (`redis::Script` does the NOSCRIPT dance).
//! The shared helpers in `lua/prelude.lua` are prepended to every script.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// Builds a script: an optional Redis 7 shebang line with flags, the
/// prelude, then the body.
pub(crate) fn with_prelude(flags: Option<&str>, body: &str) -> Script {
    match flags {
        Some(flags) => Script::new(&format!("#!lua flags={flags}\n{PRELUDE}\n{body}")),
        None => Script::new(&format!("{PRELUDE}\n{body}")),
    }
}

macro_rules! script {
    ($name:ident, $file:literal) => {
        script!($name, $file, None);
    };
    ($name:ident, $file:literal, $flags:expr) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| with_prelude($flags, include_str!(concat!("lua/", $file))));
    };
}

/// Scripts that drain or maintain a queue must keep working when Redis is at
/// `maxmemory` with `noeviction`: draining is what frees memory. They only
/// move ids, shrink or rewrite small fields, so `allow-oom` cannot make
/// memory grow by much. Enqueue has no flag: at OOM it fails loudly.
const DRAIN: Option<&str> = Some("allow-oom");

script!(ENQUEUE, "enqueue.lua");
script!(FETCH, "fetch.lua", DRAIN);
script!(CLAIM, "claim.lua", DRAIN);
script!(ACK, "ack.lua", DRAIN);
script!(EXTEND, "extend.lua", DRAIN);
script!(FAIL, "fail.lua", DRAIN);
script!(PROMOTE, "promote.lua", DRAIN);
script!(RECLAIM, "reclaim.lua", DRAIN);

// Locks use plain scripts: they touch only the lock's own keys.
pub(crate) static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lock_acquire.lua")));
pub(crate) static LOCK_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lock_extend.lua")));
pub(crate) static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lock_release.lua")));
