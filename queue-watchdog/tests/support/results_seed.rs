//! Jobs of docs/RESULTS.md as Redis holds them, for the `jobs show` and
//! dashboard tests (`#[path]`-included by `cli.rs` and `dashboard.rs`).

use queue_testkit::RedisServer;

/// Seeds, on queue `emails`: `p1` running with progress 50 "half way", `r1`
/// completed with a typed result (`{"n": 7}`), `x1` dead-lettered as expired
/// (docs/RESULTS.md).
pub fn seed_progress_result_and_expiry(server: &RedisServer) {
    server
        .command(&[
            "HSET",
            "q:{emails}:job:p1",
            "state",
            "active",
            "type",
            "send",
            "v",
            "1",
            "attempts",
            "1",
            "max_attempts",
            "3",
            "token",
            "t1",
            "payload",
            "x",
            "progress",
            "50",
            "progress_message",
            "\"half way\"",
            "progress_at",
            "1764000000000",
        ])
        .unwrap();
    server
        .command(&["LPUSH", "q:{emails}:processing", "p1"])
        .unwrap();
    server
        .command(&["ZADD", "q:{emails}:leases", "99999999999999", "p1"])
        .unwrap();
    // The marker byte 0xc1, then {"n": 7} as MessagePack: binary, so written by Lua.
    let record = "\"redis.call('HSET', KEYS[1], 'status', 'done', 'finished_at', '1764000000000', \
                  'result', string.char(193, 129, 161, 110, 7))\"";
    server
        .command(&["EVAL", record, "1", "q:{emails}:done:r1"])
        .unwrap();
    server
        .command(&[
            "HSET",
            "q:{emails}:job:x1",
            "state",
            "dead",
            "type",
            "send",
            "v",
            "1",
            "attempts",
            "0",
            "max_attempts",
            "3",
            "payload",
            "x",
            "dead_at",
            "1764000000000",
            "dead_reason",
            "\"expired: not started before its deadline (1 ms, Redis clock)\"",
        ])
        .unwrap();
    server.command(&["LPUSH", "q:{emails}:dead", "x1"]).unwrap();
}
