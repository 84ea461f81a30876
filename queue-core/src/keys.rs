//! Key layout. Every key of one queue shares the hash tag `{<queue>}` so all
//! of a queue's scripts touch a single cluster slot (DESIGN rule 6,
//! docs/DESIGN.md). Build keys with [`QueueKeys`], never by hand.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `q:{<queue>}:main` | list | ids waiting to run (LPUSH in, taken from the right: FIFO) |
//! | `q:{<queue>}:processing` | list | ids taken by a worker (BLMOVE/LMOVE target) |
//! | `q:{<queue>}:leases` | zset | id → lease expiry (ms, Redis clock) of each delivery |
//! | `q:{<queue>}:delayed` | zset | id → run-at (ms): retries and delayed jobs |
//! | `q:{<queue>}:dead` | list | dead-lettered ids, newest first |
//! | `q:{<queue>}:job:<id>` | hash | payload and metadata of one job |
//! | `q:{<queue>}:done:<id>` | hash | completion record, expires after the retention |
//! | `q:{<queue>}:once:<id>` | string | marker: this id was enqueued; refuses it again until it expires (periodic jobs) |
//! | `q:{<queue>}:steps:<id>` | hash | results of `ctx.step(..)` calls, expire with the completion record |
//! | `q:{<queue>}:stats` | hash | lifetime counters (enqueued, completed, retried, dead, reclaimed, ...) |
//! | `q:{<queue>}:tput:<minute>` | string | completions in that minute (epoch minutes), expires after 3 minutes |
//! | `q:{<queue>}:fetch:<token base>` | list | receipt of one fetch (`tag:id` per row), expires after half a lease: a retried fetch gets the same deliveries |
//! | `q:{<queue>}:paused` | string | present while the queue is paused: the Redis time (ms) of the pause |
//! | `q:{<queue>}:versions` | hash | `type:version` → expiry (ms, Redis clock): the payload versions live workers announced (rolling deploys) |
//! | `q:{<queue>}:cron` | hash | periodic job type → `<unix seconds> <schedule>`: the last firing a scheduler handled, read at start-up to catch up firings missed while every worker was down |
//! | `q:{<queue>}:limits` | hash | rate limits and concurrency caps (docs/LIMITS.md); `:limits:started[:<key>]` zsets log starts, `:limits:running:<key>` a key's running ids (indexed by the zset `:limits:runkeys`, which the fetches sweep), `:limits:next:<key>` its next deferral slot, `:limits:deferred:<key>` its deferred jobs (indexed by `:limits:deferkeys`; `:limits:releasing` the keys whose deferred jobs a change of limits releases, `:limits:walk` the cursor of an every-key change's walk of `deferkeys`) |
//! | `q:{<queue>}:groups` | list | fair-queuing ring: `""` (main's turn) and each group with waiting jobs (docs/GROUPS.md) |
//! | `q:{<queue>}:g:<group>` | list | ids of group `<group>` waiting to run (LPUSH in, taken from the right) |
//! | `q:{<queue>}:gpaused` | hash | paused group → Redis time (ms) of its pause |
//! | `q:{<queue>}:events` | stream | the queue's bounded event stream, written while `events:on` is set (docs/EVENTS.md) |
//! | `q:{<queue>}:events:on` | string | the stream's cap (`MAXLEN ~`): events are on while it holds a number > 0 |
//! | `q:{<queue>}:hist:<id>` | list | a job's history of unusual transitions (JSON entries, capped at 50), expires with the job |
//! | `q:{<queue>}:notify:<id>` | list | wake-ups of the producers waiting for job `<id>`'s result, expires after 60 s |
//! | `q:{<queue>}:pending` | hash | callback id → batch key of each callback of a sealed batch on this queue not created yet (its waiters count in the batch hash, field `notify:<id>`); written at the seal, removed when the batch fires (docs/RESULTS.md) |
//! | `q:{<queue>}:relay` | list | cross-queue relay notices written by this queue's batch members for batches on other queues, oldest first; `:relay:seq` numbers them, `:relay:dead` keeps those that could not be applied, with the reason (docs/WORKFLOWS.md) |
//! | `q:{<queue>}:orphan:cursor` | string | where the watchdog's next orphan scan of processing starts (entries from its tail), absent while it starts at the tail |
//! | `q:{<queue>}:guard` | never written | declared by scripts that reach undeclared keys, so they never run on a migrating cluster slot |
//!
//! ```
//! let keys = queue_core::QueueKeys::new("emails");
//! assert_eq!(keys.main, "q:{emails}:main");
//! assert_eq!(keys.job("42"), "q:{emails}:job:42");
//! ```

/// Checks that `queue` can name a queue's keys: not empty, no `{` or `}`
/// (the name is the keys' hash tag: a brace moves the tag, so the keys of
/// one queue land in several cluster slots, and queue `a}:job:x`'s job `y`
/// would be queue `a`'s job `x}:job:y`), no whitespace or control
/// characters. The `#[job(queue = …)]` attribute applies the same rule at
/// compile time (queue-macros' `validate_queue`, a test keeps them equal);
/// [`Queue`](crate::Queue)'s enqueues apply it before anything is sent
/// ([`QueueError::InvalidQueueName`](crate::QueueError::InvalidQueueName)).
/// `Err` completes "a queue name …".
///
/// ```
/// assert!(queue_core::validate_queue_name("emails").is_ok());
/// assert!(queue_core::validate_queue_name("").is_err());
/// assert!(queue_core::validate_queue_name("a}:job:x").is_err());
/// ```
pub fn validate_queue_name(queue: &str) -> Result<(), &'static str> {
    if queue.is_empty() {
        Err("must not be empty")
    } else if queue.contains(['{', '}']) {
        Err("must not contain `{` or `}` (queue names become Redis hash tags)")
    } else if queue.chars().any(char::is_whitespace) {
        Err("must not contain whitespace")
    } else if queue.chars().any(char::is_control) {
        Err("must not contain control characters")
    } else {
        Ok(())
    }
}

/// The Redis key names of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueKeys {
    /// Queue name.
    pub queue: String,
    /// Waiting ids.
    pub main: String,
    /// Ids taken by workers.
    pub processing: String,
    /// Lease expiry per delivered id.
    pub leases: String,
    /// Retries and delayed jobs, by run-at time.
    pub delayed: String,
    /// Dead-lettered ids.
    pub dead: String,
    /// Lifetime counters.
    pub stats: String,
    /// Promoter wake-up: a one-element list that writers of `delayed` push
    /// to when they add a job sooner than its head; a sleeping promoter
    /// waits on it with `BLPOP` (background/promoter.rs).
    pub wake: String,
    /// Prefix of job hashes (`job_prefix + id`).
    pub job_prefix: String,
    /// Prefix of completion records (`done_prefix + id`).
    pub done_prefix: String,
    /// Prefix of step-result hashes (`steps_prefix + id`).
    pub steps_prefix: String,
    /// Prefix of per-minute completion counters (`tput_prefix + epoch minute`).
    pub tput_prefix: String,
    /// Prefix of fetch receipts (`fetch_receipt_prefix + token base`).
    pub fetch_receipt_prefix: String,
    /// A key that is never written. Scripts that reach keys they do not
    /// declare (job hashes and completion records, by prefix) declare this
    /// one too: while the queue's cluster slot is being migrated, Redis then
    /// answers them TRYAGAIN (a declared key is missing) instead of running
    /// them until the first undeclared key that already moved
    /// (see docs/SCALE-OUT.md, "Live resharding").
    pub guard: String,
}

impl QueueKeys {
    /// Key names for `queue`.
    pub fn new(queue: &str) -> Self {
        let base = format!("q:{{{queue}}}:");
        QueueKeys {
            queue: queue.to_string(),
            main: format!("{base}main"),
            processing: format!("{base}processing"),
            leases: format!("{base}leases"),
            delayed: format!("{base}delayed"),
            dead: format!("{base}dead"),
            stats: format!("{base}stats"),
            wake: format!("{base}wake"),
            job_prefix: format!("{base}job:"),
            done_prefix: format!("{base}done:"),
            steps_prefix: format!("{base}steps:"),
            tput_prefix: format!("{base}tput:"),
            fetch_receipt_prefix: format!("{base}fetch:"),
            guard: format!("{base}guard"),
        }
    }

    /// The hash of job `id`.
    pub fn job(&self, id: &str) -> String {
        format!("{}{}", self.job_prefix, id)
    }

    /// The completion record of job `id`.
    pub fn done(&self, id: &str) -> String {
        format!("{}{}", self.done_prefix, id)
    }

    /// The once-marker of job id `id` (periodic jobs).
    pub fn once(&self, id: &str) -> String {
        format!("q:{{{}}}:once:{}", self.queue, id)
    }

    /// The receipt of the fetch made with `token_base`: which ids it took,
    /// so that a retry whose first reply was lost gets the same deliveries.
    pub fn fetch_receipt(&self, token_base: &str) -> String {
        format!("{}{}", self.fetch_receipt_prefix, token_base)
    }

    /// The pause flag: present while the queue is paused, holding the Redis
    /// time (ms) of the pause (docs/FLOW-CONTROL.md).
    pub fn paused(&self) -> String {
        format!("q:{{{}}}:paused", self.queue)
    }

    /// The versions hash: field `type:version` → expiry (ms, Redis clock) of
    /// the latest announcement by a live worker that handles that payload
    /// version on this queue. A worker that receives a newer payload than
    /// its handler leaves the job for one announced here (docs/RELIABILITY.md,
    /// "Rolling deploys").
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.versions(), "q:{emails}:versions");
    /// ```
    pub fn versions(&self) -> String {
        format!("q:{{{}}}:versions", self.queue)
    }

    /// The cron hash: periodic job type → `<unix seconds> <schedule>`, the
    /// last firing of that job a scheduler handled (enqueued, or found
    /// enqueued by another worker). A scheduler that starts reads it to
    /// enqueue what no scheduler did while every worker was down
    /// (`cron_mark.lua`, docs/ARCHITECTURE.md "Cron catch-up").
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.cron(), "q:{emails}:cron");
    /// ```
    pub fn cron(&self) -> String {
        format!("q:{{{}}}:cron", self.queue)
    }

    /// The relay list: notices this queue's batch members wrote for batches
    /// on other queues (another hash tag), oldest first, until the relay
    /// applies them there (docs/WORKFLOWS.md, "Relay").
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.relay(), "q:{emails}:relay");
    /// ```
    pub fn relay(&self) -> String {
        format!("q:{{{}}}:relay", self.queue)
    }

    /// The last seq given to a relay notice of this queue (a string, INCR):
    /// the relay applies a member's notices once each by it.
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.relay_seq(), "q:{emails}:relay:seq");
    /// ```
    pub fn relay_seq(&self) -> String {
        format!("q:{{{}}}:relay:seq", self.queue)
    }

    /// Relay notices that could not be applied (the batch is gone or
    /// corrupt), newest first, each `<reason>\n<notice>`.
    pub fn relay_dead(&self) -> String {
        format!("q:{{{}}}:relay:dead", self.queue)
    }

    /// Where the watchdog's next orphan scan of `processing` starts: a count
    /// of entries from its tail (a string). Each reclaim call looks at
    /// `orphan_scan` entries from there for ids without a lease and moves
    /// it on by as many, back to the tail past the head, so every entry is
    /// looked at within `len / orphan_scan` calls (`reclaim.lua`). Absent
    /// while the scan starts at the tail.
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.orphan_cursor(), "q:{emails}:orphan:cursor");
    /// ```
    pub fn orphan_cursor(&self) -> String {
        format!("q:{{{}}}:orphan:cursor", self.queue)
    }

    /// The step results of job `id`.
    pub fn steps(&self, id: &str) -> String {
        format!("{}{}", self.steps_prefix, id)
    }

    /// The limits hash (rate limits, concurrency caps; docs/LIMITS.md). The
    /// scripts derive the keys that log starts from it: `<limits>:started`
    /// (the queue's), `<limits>:started:<key>`, `<limits>:running:<key>`
    /// `<limits>:next:<key>` and `<limits>:deferred:<key>` (one rate key's),
    /// `<limits>:runkeys` (the index of the running sets), `<limits>:deferkeys`
    /// (of the deferred sets), `<limits>:releasing` and `<limits>:walk`.
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.limits(), "q:{emails}:limits");
    /// ```
    pub fn limits(&self) -> String {
        format!("q:{{{}}}:limits", self.queue)
    }

    /// The fair-queuing ring: `""` (main's turn) and every group with
    /// waiting jobs, in serving order (docs/GROUPS.md). Absent while no
    /// group has jobs.
    pub fn groups(&self) -> String {
        format!("q:{{{}}}:groups", self.queue)
    }

    /// The waiting list of group `group` (jobs enqueued with
    /// [`EnqueueOptions::group`](crate::EnqueueOptions::group)).
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.group("acme"), "q:{emails}:g:acme");
    /// ```
    pub fn group(&self, group: &str) -> String {
        format!("{}{}", self.group_prefix(), group)
    }

    /// Prefix of the group waiting lists (`group_prefix() + group`).
    pub fn group_prefix(&self) -> String {
        format!("q:{{{}}}:g:", self.queue)
    }

    /// The paused groups: hash group → Redis time (ms) of its pause.
    pub fn groups_paused(&self) -> String {
        format!("q:{{{}}}:gpaused", self.queue)
    }

    /// The hash of batch (or flow) `id` homed on this queue; `<key>:done`,
    /// `<key>:members` and `<key>:results` are its sets and results
    /// (docs/WORKFLOWS.md).
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.batch("b1"), "q:{emails}:batch:b1");
    /// ```
    pub fn batch(&self, id: &str) -> String {
        format!("q:{{{}}}:batch:{}", self.queue, id)
    }

    /// The index of this queue's batches: a sorted set, batch id → creation
    /// time (ms), written by `batch_open.lua`; an entry whose batch expired
    /// is swept out by later opens (docs/WORKFLOWS.md, "Operating batches").
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.batches(), "q:{emails}:batches");
    /// ```
    pub fn batches(&self) -> String {
        format!("q:{{{}}}:batches", self.queue)
    }

    /// Where the sweep of [`batches`](Self::batches) resumes (a rank).
    pub fn batches_sweep(&self) -> String {
        format!("q:{{{}}}:batches:sweep", self.queue)
    }

    /// The queue's event stream (docs/EVENTS.md).
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.events(), "q:{emails}:events");
    /// assert_eq!(keys.events_on(), "q:{emails}:events:on");
    /// assert_eq!(keys.hist("42"), "q:{emails}:hist:42");
    /// ```
    pub fn events(&self) -> String {
        format!("q:{{{}}}:events", self.queue)
    }

    /// The event switch: while it holds a number N > 0 the queue's scripts
    /// append to [`events`](Self::events), capped at about N entries.
    pub fn events_on(&self) -> String {
        format!("q:{{{}}}:events:on", self.queue)
    }

    /// The history of job `id`: its unusual transitions (retries, lease
    /// returns, dead-letter, replays, cancel), one JSON entry each.
    pub fn hist(&self, id: &str) -> String {
        format!("q:{{{}}}:hist:{}", self.queue, id)
    }

    /// The wake-up list of job `id`'s result waiters (`Queue::wait_result`,
    /// docs/RESULTS.md): the script that finishes the job pushes one element
    /// per waiter; it expires after 60 s.
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.notify("42"), "q:{emails}:notify:42");
    /// ```
    pub fn notify(&self, id: &str) -> String {
        format!("q:{{{}}}:notify:{}", self.queue, id)
    }

    /// The callbacks not created yet of this queue's sealed batches: a hash,
    /// callback id → batch key, written by `batch_seal.lua` and removed when
    /// the batch fires. `result_wait.lua` reads it so that waiting on a
    /// flow's parent (or a batch's callback, a DAG step) before it exists
    /// waits instead of answering `NotFound` (docs/RESULTS.md).
    ///
    /// ```
    /// let keys = queue_core::QueueKeys::new("emails");
    /// assert_eq!(keys.pending(), "q:{emails}:pending");
    /// ```
    pub fn pending(&self) -> String {
        format!("q:{{{}}}:pending", self.queue)
    }

    /// Whether `key`, a key of some queue, is one the scripts give a TTL on
    /// purpose: completion records, step results, once-markers, throughput
    /// minutes, fetch receipts, job histories, result wake-ups, a batch's
    /// keys (its open TTL until sealed, its keep time once fired) and the
    /// rate-limit logs. A TTL on any other queue key
    /// (a list, a job hash, the counters) loses jobs when it fires; the
    /// operator's `doctor` reports those and not these.
    ///
    /// ```
    /// use queue_core::QueueKeys;
    /// let keys = QueueKeys::new("emails");
    /// assert!(QueueKeys::expires_by_design(&keys.done("42")));
    /// assert!(QueueKeys::expires_by_design(&keys.hist("42")));
    /// assert!(QueueKeys::expires_by_design(&keys.batch("b1")));
    /// assert!(!QueueKeys::expires_by_design(&keys.job("42")));
    /// assert!(!QueueKeys::expires_by_design(&keys.batches()));
    /// assert!(!QueueKeys::expires_by_design(&keys.main));
    /// ```
    pub fn expires_by_design(key: &str) -> bool {
        let Some(rest) = key.find("}:").map(|i| &key[i + 2..]) else {
            return false;
        };
        const PER_ID: [&str; 8] = [
            "done:", "steps:", "once:", "tput:", "fetch:", "hist:", "notify:", "batch:",
        ];
        // `limits:started` (the queue's log) and `limits:started:<key>`,
        // `limits:next:<key>`, `limits:deferred:<key>`; not `limits` itself
        // nor `limits:running:<key>`, `limits:deferkeys`, `limits:releasing`,
        // `limits:walk`.
        PER_ID.iter().any(|p| rest.starts_with(p))
            || rest == "limits:started"
            || rest.starts_with("limits:started:")
            || rest.starts_with("limits:next:")
            || rest.starts_with("limits:deferred:")
    }
}

/// The keys of a user lock ([`Lock`](crate::Lock)): `lock:{<name>}` holds the
/// owner token with a TTL, `lock:{<name>}:fence` the fencing counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// Owner token, with the lock's TTL.
    pub(crate) lock: String,
    /// Fencing counter, incremented by each acquisition.
    pub(crate) fence: String,
}

impl LockKeys {
    /// Key names of lock `name`.
    pub(crate) fn new(name: &str) -> Self {
        LockKeys {
            lock: format!("lock:{{{name}}}"),
            fence: format!("lock:{{{name}}}:fence"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QueueKeys;

    #[test]
    fn the_keys_the_scripts_expire_are_known_and_no_other() {
        let k = QueueKeys::new("a");
        for key in [
            k.done("1"),
            k.steps("1"),
            k.once("1"),
            k.fetch_receipt("6f1c0e2a-token-base"),
            format!("{}29000000", k.tput_prefix),
            k.hist("1"),
            k.notify("1"),
            k.batch("b"),
            format!("{}:members", k.batch("b")),
            format!("{}:started", k.limits()),
            format!("{}:started:acme", k.limits()),
            format!("{}:next:acme", k.limits()),
            format!("{}:deferred:acme", k.limits()),
        ] {
            assert!(QueueKeys::expires_by_design(&key), "{key}");
        }
        for key in [
            k.job("done:1"),
            k.main.clone(),
            k.processing.clone(),
            k.leases.clone(),
            k.delayed.clone(),
            k.dead.clone(),
            k.stats.clone(),
            k.limits(),
            format!("{}:running:acme", k.limits()),
            format!("{}:runkeys", k.limits()),
            format!("{}:deferkeys", k.limits()),
            format!("{}:releasing", k.limits()),
            format!("{}:walk", k.limits()),
            k.batches(),
            k.pending(),
            k.group("g"),
            k.events(),
            "lock:{report}".to_string(),
        ] {
            assert!(!QueueKeys::expires_by_design(&key), "{key}");
        }
    }
}
