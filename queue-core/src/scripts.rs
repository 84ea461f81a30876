//! The Lua scripts. Each multi-key state change is one script, run with
//! EVALSHA and a fallback to EVAL (`redis::Script` does the NOSCRIPT dance).
//! The shared helpers in `lua/prelude.lua` are prepended to every script.

use std::sync::LazyLock;

use redis::Script;

const PRELUDE: &str = include_str!("lua/prelude.lua");

fn with_prelude(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| with_prelude(include_str!(concat!("lua/", $file))));
    };
}

script!(ENQUEUE, "enqueue.lua");
script!(FETCH, "fetch.lua");
script!(CLAIM, "claim.lua");
script!(ACK, "ack.lua");
script!(EXTEND, "extend.lua");
script!(FAIL, "fail.lua");
script!(PROMOTE, "promote.lua");
script!(RECLAIM, "reclaim.lua");
script!(REPLAY, "replay.lua");
script!(STATS, "stats.lua");

// Locks use plain scripts: they touch only the lock's own keys.
pub(crate) static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lock_acquire.lua")));
pub(crate) static LOCK_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lock_extend.lua")));
pub(crate) static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lock_release.lua")));
