//! Script-level tests of `enqueue_many.lua` against a real redis-server:
//! validation of every job before the first write (mode `all`) or per job
//! (mode `each`), the per-job checks of `enqueue.lua` (duplicate in the call,
//! completion record, once-marker, enqueue token on a retry), and the costs
//! the script exists for (one TIME and one stats update per call, no dedupe
//! read for a fresh id).

use std::time::Duration;

use redis::AsyncCommands;

use super::enqueue::{Enqueue, EnqueueReply};
use super::enqueue_many::{run, ManyJob, ManyReply, Mode};
use crate::conn::RedisConnection;
use crate::job::JobId;
use crate::keys::QueueKeys;
use crate::state::JobState;

async fn setup() -> (queue_testkit::RedisServer, RedisConnection, QueueKeys) {
    let (server, conn) = crate::scripts::test_redis().await;
    (server, conn, QueueKeys::new("many"))
}

fn pair(n: &str, v: &str) -> (String, String) {
    (n.to_string(), v.to_string())
}

/// Writes a string over group `G`'s list (`corrupt` "group list") or the
/// ring ("ring"): corrupt data a grouped enqueue must not write past.
async fn corrupt_group_key(conn: &mut RedisConnection, keys: &QueueKeys, corrupt: &str) -> String {
    let key = if corrupt == "ring" {
        keys.groups()
    } else {
        keys.group("G")
    };
    let _: () = conn.set(&key, "x").await.unwrap();
    key
}

/// `enqueue.lua` for job `id` (type `t`, version 1, empty payload, token
/// `T`) with raw `[max_attempts, delay_ms, run_at_ms, once ttl_ms]`: values
/// the typed wrapper cannot send.
async fn raw_enqueue(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    id: &str,
    numbers: [&str; 4],
) -> crate::Result<redis::Value> {
    raw_enqueue_as(conn, keys, id, "1", numbers).await
}

/// [`raw_enqueue`] with a raw schema `version` too.
async fn raw_enqueue_as(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    id: &str,
    version: &str,
    numbers: [&str; 4],
) -> crate::Result<redis::Value> {
    let mut call = super::enqueue::SCRIPT
        .call(super::enqueue::script_keys(keys, id))
        .arg(id)
        .arg("t")
        .arg(version)
        .arg("");
    for n in numbers {
        call = call.arg(n);
    }
    call.arg("T")
        .run(conn, &keys.queue, Some(&JobId::from(id)))
        .await
}

/// Job ids from their names.
fn job_ids(names: &[&str]) -> Vec<JobId> {
    names.iter().copied().map(JobId::from).collect()
}

/// One test job per id, each with a fresh enqueue token.
fn fresh_jobs<'a>(keys: &'a QueueKeys, ids: &'a [JobId]) -> Vec<ManyJob<'a>> {
    shaped_fresh_jobs(keys, ids, |_, job| job)
}

/// As [`fresh_jobs`], each job as `shape` makes it from the plain test job
/// of its id.
fn shaped_fresh_jobs<'a>(
    keys: &'a QueueKeys,
    ids: &'a [JobId],
    shape: impl Fn(&JobId, Enqueue<'a>) -> Enqueue<'a>,
) -> Vec<ManyJob<'a>> {
    ids.iter()
        .map(|id| ManyJob {
            job: shape(id, Enqueue::test_job(keys, id, 1)),
            token: "t",
            fresh: true,
        })
        .collect()
}

async fn enqueued_stat(conn: &mut RedisConnection, keys: &QueueKeys) -> i64 {
    let v: Option<i64> = conn.hget(&keys.stats, "enqueued").await.unwrap();
    v.unwrap_or(0)
}

#[tokio::test]
async fn mode_all_refuses_the_whole_call_before_any_write() {
    let (_s, mut conn, keys) = setup().await;
    let ids = job_ids(&["a", "b", "c"]);
    let bad = [pair("state", "done")];
    let jobs: Vec<ManyJob<'_>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| ManyJob {
            job: Enqueue {
                extra: if i == 2 { &bad } else { &[] },
                ..Enqueue::test_job(&keys, id, 1)
            },
            token: "t",
            fresh: false,
        })
        .collect();
    let err = run(&mut conn, &keys, Mode::All, &jobs).await.unwrap_err();
    assert!(err.to_string().contains("core job field"), "{err}");
    let main: i64 = conn.llen(&keys.main).await.unwrap();
    let hashes: i64 = conn.exists(keys.job("a")).await.unwrap();
    assert_eq!(
        (main, hashes, enqueued_stat(&mut conn, &keys).await),
        (0, 0, 0)
    );
}

/// Main of another type (corrupt data): the call is refused before the first
/// job's hash is written, not after (the LPUSH to main comes once per call,
/// after the hashes).
#[tokio::test]
async fn a_main_of_another_type_refuses_the_call_before_any_write() {
    let (_s, mut conn, keys) = setup().await;
    let _: () = conn.set(&keys.main, "not a list").await.unwrap();
    let ids = job_ids(&["a", "b"]);
    let jobs = fresh_jobs(&keys, &ids);
    let err = run(&mut conn, &keys, Mode::Each, &jobs).await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let hashes: i64 = conn.exists(&[keys.job("a"), keys.job("b")]).await.unwrap();
    assert_eq!((hashes, enqueued_stat(&mut conn, &keys).await), (0, 0));
}

/// Jobs of one call land in main in call order, grouped ones in their group
/// list, delayed ones in the delayed set: one LPUSH for the call's main jobs.
#[tokio::test]
async fn main_jobs_of_a_call_are_pushed_in_order_with_one_lpush() {
    let (_s, mut conn, keys) = setup().await;
    let ids = job_ids(&["a", "g", "b", "late", "c"]);
    let group = [pair("group", "tenant-1")];
    let jobs: Vec<ManyJob<'_>> = ids
        .iter()
        .map(|id| ManyJob {
            job: Enqueue {
                extra: if id.as_str() == "g" { &group } else { &[] },
                delay: (id.as_str() == "late").then_some(Duration::from_secs(60)),
                ..Enqueue::test_job(&keys, id, 1)
            },
            token: "t",
            fresh: true,
        })
        .collect();
    super::reset_command_stats(&mut conn).await;
    run(&mut conn, &keys, Mode::Each, &jobs).await.unwrap();
    let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
    assert_eq!(
        main,
        ["c", "b", "a"],
        "oldest at the tail, as LPUSH one by one"
    );
    let grouped: Vec<String> = conn.lrange(keys.group("tenant-1"), 0, -1).await.unwrap();
    assert_eq!(grouped, ["g"]);
    let delayed: Vec<String> = conn.zrange(&keys.delayed, 0, -1).await.unwrap();
    assert_eq!(delayed, ["late"]);
    // One LPUSH for main's three jobs, one for the group list, one to wake
    // the promoter for the delayed job (one per main job before: 5).
    assert_eq!(super::command_calls(&mut conn, "lpush").await, 3);
}

#[tokio::test]
async fn mode_each_answers_invalid_for_that_job_and_writes_the_others() {
    let (_s, mut conn, keys) = setup().await;
    let ids = job_ids(&["a", "b", "c"]);
    let bad = [pair("", "v")];
    let jobs: Vec<ManyJob<'_>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| ManyJob {
            job: Enqueue {
                extra: if i == 1 { &bad } else { &[] },
                ..Enqueue::test_job(&keys, id, 1)
            },
            token: "t",
            fresh: false,
        })
        .collect();
    let replies = run(&mut conn, &keys, Mode::Each, &jobs).await.unwrap();
    assert!(matches!(
        replies[..],
        [
            ManyReply::Enqueued(EnqueueReply::Created { .. }),
            ManyReply::Invalid(_),
            ManyReply::Enqueued(EnqueueReply::Created { .. })
        ]
    ));
    let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
    assert_eq!(main, vec!["c", "a"]);
    let b: i64 = conn.exists(keys.job("b")).await.unwrap();
    assert_eq!((b, enqueued_stat(&mut conn, &keys).await), (0, 2));
}

/// Producers in other languages call the documented modes `each` and `all`
/// (docs/PROTOCOL.md) and get `['new', run_at]` per job written; `Queue`
/// sends their `:int` forms and gets the run_at alone, for a job written now,
/// a delayed one, and a retry's own job (found by its enqueue token). Any
/// other mode refuses the call.
#[tokio::test]
async fn the_documented_modes_answer_new_tables_and_their_int_forms_bare_run_ats() {
    let (_s, mut conn, keys) = setup().await;
    let ids = job_ids(&["a", "b", "c", "d", "e"]);
    let job = |i: usize, delay_ms: u64| ManyJob {
        job: Enqueue {
            delay: (delay_ms > 0).then(|| Duration::from_millis(delay_ms)),
            ..Enqueue::test_job(&keys, &ids[i], 1)
        },
        token: "tok",
        fresh: false,
    };
    let run_at = |v: &redis::Value| -> Option<i64> {
        match v {
            redis::Value::Int(n) => Some(*n),
            _ => None,
        }
    };
    for (mode, first, second) in [("each", 0, 1), ("all", 2, 3)] {
        let jobs = [job(first, 0), job(second, 60_000)];
        let call = super::enqueue_many::call_in_mode(&keys, mode, &jobs);
        let reply = call.run(&mut conn, &keys.queue, None).await.unwrap();
        let tables = super::reply::array(&reply).unwrap();
        let mut at = Vec::new();
        for t in tables {
            let row = super::reply::array(t).unwrap_or_else(|| panic!("{mode}: {t:?}"));
            assert_eq!(
                super::reply::text(&row[0]).as_deref(),
                Some("new"),
                "{mode}"
            );
            at.push(super::reply::int(&row[1]).unwrap());
        }
        assert_eq!(at[1] - at[0], 60_000, "{mode}: the delayed job's run_at");
        // The same call again in the `:int` form: found by its token, answered
        // with the same run_ats, as bare integers.
        let int_mode = format!("{mode}:int");
        let call = super::enqueue_many::call_in_mode(&keys, &int_mode, &jobs);
        let again = call.run(&mut conn, &keys.queue, None).await.unwrap();
        let again: Vec<Option<i64>> = super::reply::array(&again)
            .unwrap()
            .iter()
            .map(run_at)
            .collect();
        assert_eq!(again, vec![Some(at[0]), Some(at[1])], "{int_mode}");
    }
    let new = [ManyJob {
        job: Enqueue::test_job(&keys, &ids[4], 1),
        token: "",
        fresh: true,
    }];
    let reply = super::enqueue_many::call_in_mode(&keys, "each:int", &new)
        .run(&mut conn, &keys.queue, None)
        .await
        .unwrap();
    assert!(
        run_at(&super::reply::array(&reply).unwrap()[0]).is_some(),
        "{reply:?}"
    );
    let err = super::enqueue_many::call_in_mode(&keys, "each:text", &new)
        .run(&mut conn, &keys.queue, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("mode: each:text"), "{err}");
}

/// The checks of `enqueue.lua`, per job: a second job of the call with the
/// same id, a completion record, a once-marker; a retried call (same tokens,
/// `fresh` off) answers `new` again for its own jobs and writes nothing twice.
#[tokio::test]
async fn per_job_dedupe_and_a_retry_with_the_same_tokens() {
    let (_s, mut conn, keys) = setup().await;
    let _: () = conn
        .hset(keys.done("d"), "status", "completed")
        .await
        .unwrap();
    let ids = job_ids(&["x", "x", "d", "o", "o"]);
    let tokens = ["t1", "t2", "t3", "t4", "t5"];
    let many = |fresh: bool| -> Vec<ManyJob<'_>> {
        ids.iter()
            .zip(tokens)
            .map(|(id, token)| ManyJob {
                job: Enqueue {
                    once_for: (id.as_str() == "o").then_some(Duration::from_secs(60)),
                    ..Enqueue::test_job(&keys, id, 1)
                },
                token,
                fresh,
            })
            .collect()
    };
    let first = run(&mut conn, &keys, Mode::Each, &many(false))
        .await
        .unwrap();
    let tags = |r: &[ManyReply]| -> Vec<String> {
        r.iter()
            .map(|r| match r {
                ManyReply::Enqueued(EnqueueReply::Created { .. }) => "new".to_string(),
                ManyReply::Enqueued(EnqueueReply::Exists { state }) => format!("exists {state}"),
                ManyReply::Enqueued(EnqueueReply::Done) => "done".to_string(),
                ManyReply::Invalid(r) => format!("invalid {r}"),
            })
            .collect()
    };
    assert_eq!(
        tags(&first),
        ["new", "exists queued", "done", "new", "exists scheduled"]
    );
    assert_eq!(
        first[4],
        ManyReply::Enqueued(EnqueueReply::Exists {
            state: JobState::Scheduled
        })
    );
    // The retry of a call whose reply was lost: the same tokens.
    let again = run(&mut conn, &keys, Mode::Each, &many(false))
        .await
        .unwrap();
    assert_eq!(tags(&again)[0], "new");
    assert_eq!(tags(&again)[3], "new");
    let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
    assert_eq!(main, vec!["o", "x"]);
    assert_eq!(enqueued_stat(&mut conn, &keys).await, 2);
}

/// What the script is for: one TIME and one HINCRBY per call, and no EXISTS
/// for fresh (generated) ids; delayed jobs go to the delayed set and
/// wake the promoter once; a `group` extra field puts the job in its group.
#[tokio::test]
async fn one_time_and_one_counter_per_call_and_no_dedupe_read_for_fresh_ids() {
    let (_s, mut conn, keys) = setup().await;
    let ids: Vec<JobId> = (0..20).map(|_| JobId::random()).collect();
    let group = [pair("group", "g1")];
    let jobs: Vec<ManyJob<'_>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| ManyJob {
            job: Enqueue {
                delay: i.is_multiple_of(4).then_some(Duration::from_secs(60)),
                extra: if i == 1 { &group } else { &[] },
                ..Enqueue::test_job(&keys, id, 3)
            },
            token: "tok",
            fresh: true,
        })
        .collect();
    // Loads the script outside the counted window.
    super::library::load(&mut conn).await.unwrap();
    super::reset_command_stats(&mut conn).await;
    let replies = run(&mut conn, &keys, Mode::Each, &jobs).await.unwrap();
    assert_eq!(replies.len(), 20);
    assert_eq!(super::command_calls(&mut conn, "time").await, 1);
    assert_eq!(super::command_calls(&mut conn, "hincrby").await, 1);
    // The one EXISTS is push_waiting's (the ring, for the group's first job):
    // none for the dedupe of the 20 fresh ids.
    assert_eq!(super::command_calls(&mut conn, "exists").await, 1);
    assert_eq!(super::command_calls(&mut conn, "hset").await, 20);
    assert_eq!(super::command_calls(&mut conn, "zrange").await, 1);
    let delayed: i64 = conn.zcard(&keys.delayed).await.unwrap();
    let main: i64 = conn.llen(&keys.main).await.unwrap();
    let grouped: Vec<String> = conn.lrange(keys.group("g1"), 0, -1).await.unwrap();
    let wake: i64 = conn.llen(&keys.wake).await.unwrap();
    assert_eq!((delayed, main, wake), (5, 14, 1));
    assert_eq!(grouped, vec![ids[1].to_string()]);
    assert_eq!(enqueued_stat(&mut conn, &keys).await, 20);
    let state: String = conn.hget(keys.job(ids[0].as_str()), "state").await.unwrap();
    assert_eq!(state, "delayed");
}

/// docs/PROTOCOL.md gives the SHA1 of both enqueue scripts (sections 3 and
/// 3a): producers in other languages load them by these values.
#[test]
fn the_documented_shas_are_the_scripts_queue_core_builds() {
    let doc = include_str!("../../../docs/PROTOCOL.md");
    let documented = |script: &str| {
        let marker = format!("{script} script SHA1: `");
        let at = doc.find(&marker).expect("PROTOCOL.md gives the SHA") + marker.len();
        doc[at..at + 40].to_string()
    };
    assert_eq!(
        documented("enqueue"),
        super::enqueue::SCRIPT.def.eval_script().get_hash(),
        "update section 3 of docs/PROTOCOL.md"
    );
    assert_eq!(
        documented("enqueue_many"),
        super::enqueue_many::SCRIPT.def.eval_script().get_hash(),
        "update section 3a of docs/PROTOCOL.md"
    );
}

/// Producers written before the guard key (docs/PROTOCOL.md, section 2)
/// send `enqueue.lua` six or seven keys and `enqueue_many.lua` four: their
/// calls (by the documented SHA) keep writing the job, grouped ones too.
#[tokio::test]
async fn producers_that_send_the_keys_before_the_guard_keep_working() {
    let (_server, mut conn, keys) = setup().await;
    let one = super::enqueue::SCRIPT.def.eval_script();
    for (n, id) in [(6, "six"), (7, "seven")] {
        let mut call = one.prepare_invoke();
        for key in &super::enqueue::script_keys(&keys, id)[..n] {
            call.key(key);
        }
        call.arg(id)
            .arg("t")
            .arg(1)
            .arg("")
            .arg(1)
            .arg(0)
            .arg(0)
            .arg(0);
        call.arg("").arg("group").arg("G");
        let reply: redis::Value = call.invoke_async(&mut conn).await.unwrap();
        let reply = EnqueueReply::decode(&keys.queue, &id.into(), &reply).unwrap();
        assert!(
            matches!(reply, EnqueueReply::Created { .. }),
            "{n} keys: {reply:?}"
        );
    }
    let many = super::enqueue_many::SCRIPT.def.eval_script();
    let mut call = many.prepare_invoke();
    call.key(&keys.main)
        .key(&keys.delayed)
        .key(&keys.stats)
        .key(&keys.wake);
    call.arg(&keys.job_prefix)
        .arg(&keys.done_prefix)
        .arg(keys.once(""))
        .arg("all");
    call.arg("four")
        .arg("t")
        .arg(1)
        .arg("")
        .arg(1)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg("")
        .arg(0);
    call.arg(1).arg("group").arg("G");
    let reply: Vec<redis::Value> = call.invoke_async(&mut conn).await.unwrap();
    assert_eq!(reply.len(), 1, "{reply:?}");
    let group: Vec<String> = conn.lrange(keys.group("G"), 0, -1).await.unwrap();
    assert_eq!(group, ["four", "seven", "six"]);
}

/// A stats key of another type (corrupt data) never fails the call: the
/// jobs are written and pushed, and the counter, last, is skipped. Before,
/// the call failed after its writes, so a producer saw an error for jobs
/// that were enqueued.
/// Extra fields of one job, `n` of them (`f0` = `v0`, ...).
fn many_fields(n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("f{i}"), format!("v{i}"))).collect()
}

/// A job with more extra fields than one Lua `unpack` takes (~8,000
/// values) is written whole, and so are the jobs after it in the same call:
/// the HSET raised after the earlier jobs' hashes were written, and they
/// never reached main (group commit mixes callers).
#[tokio::test]
async fn a_job_with_thousands_of_extra_fields_loses_no_job_of_its_call() {
    let (_s, mut conn, keys) = setup().await;
    let ids = job_ids(&["before", "wide", "after"]);
    let wide = many_fields(4500);
    let mut jobs = fresh_jobs(&keys, &ids);
    jobs[1].job.extra = &wide;
    run(&mut conn, &keys, Mode::Each, &jobs).await.unwrap();
    let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
    assert_eq!(main, ["after", "wide", "before"]);
    let n: usize = conn.hlen(keys.job("wide")).await.unwrap();
    assert!(n >= 4500, "{n} fields");
    let last: Option<String> = conn.hget(keys.job("wide"), "f4499").await.unwrap();
    assert_eq!(last.as_deref(), Some("v4499"));
}

/// The same through `enqueue.lua` (one job a call): the id was in main
/// with no hash when the HSET raised.
#[tokio::test]
async fn a_single_enqueue_with_thousands_of_extra_fields_is_written_whole() {
    let (_s, mut conn, keys) = setup().await;
    let id = JobId::from("wide");
    let wide = many_fields(4500);
    Enqueue {
        extra: &wide,
        ..Enqueue::test_job(&keys, &id, 1)
    }
    .run(&mut conn)
    .await
    .unwrap();
    let last: Option<String> = conn.hget(keys.job("wide"), "f4499").await.unwrap();
    assert_eq!(last.as_deref(), Some("v4499"));
    let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
    assert_eq!(main, ["wide"]);
}

#[tokio::test]
async fn a_stats_key_of_another_type_never_fails_the_call() {
    let (_s, mut conn, keys) = setup().await;
    let _: () = conn.set(&keys.stats, "not a hash").await.unwrap();
    let ids = job_ids(&["a", "b"]);
    let jobs = fresh_jobs(&keys, &ids);
    let replies = run(&mut conn, &keys, Mode::Each, &jobs).await.unwrap();
    assert_eq!(replies.len(), 2);
    let main: i64 = conn.llen(&keys.main).await.unwrap();
    assert_eq!(main, 2);
}

/// `enqueue.lua` with main of another type (corrupt data): refused before
/// any write. Before, the job hash was written first and the LPUSH then
/// failed: a `queued` hash no list held (the job was lost, and a retry with
/// the same token answered `new`).
#[tokio::test]
async fn enqueue_with_a_main_of_another_type_writes_nothing() {
    let (_s, mut conn, keys) = setup().await;
    let _: () = conn.set(&keys.main, "not a list").await.unwrap();
    let id = JobId::from("a");
    let err = Enqueue::test_job(&keys, &id, 1)
        .run_with_token(&mut conn, "T")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let hash: i64 = conn.exists(keys.job("a")).await.unwrap();
    assert_eq!((hash, enqueued_stat(&mut conn, &keys).await), (0, 0));
}

/// A grouped `enqueue.lua` whose group list, or the ring, holds another type:
/// refused before any write. Before, the hash (and with a corrupt ring the
/// group list's entry) were written, then push_waiting failed.
#[tokio::test]
async fn a_grouped_enqueue_with_a_group_list_or_ring_of_another_type_writes_nothing() {
    let group = [pair("group", "G")];
    let mut written_per_case = Vec::new();
    for corrupt in ["group list", "ring"] {
        let (_s, mut conn, keys) = setup().await;
        let key = corrupt_group_key(&mut conn, &keys, corrupt).await;
        let id = JobId::from("g");
        let err = Enqueue {
            extra: &group,
            ..Enqueue::test_job(&keys, &id, 1)
        }
        .run_with_token(&mut conn, "T")
        .await
        .unwrap_err();
        assert!(err.to_string().contains("WRONGTYPE"), "{corrupt}: {err}");
        let others: Vec<String> = [
            keys.job("g"),
            keys.group("G"),
            keys.groups(),
            keys.main.clone(),
        ]
        .into_iter()
        .filter(|k| *k != key)
        .collect();
        let written: i64 = conn.exists(&others).await.unwrap();
        written_per_case.push((corrupt, written));
    }
    assert_eq!(
        written_per_case,
        [("group list", 0), ("ring", 0)],
        "keys written"
    );
}

/// A once-marker `enqueue.lua` refused for a bad run_at, a delayed key or a
/// main of another type leaves no marker. Before, the marker's SET came
/// first: every retry (after the data was repaired) answered `exists
/// scheduled` for the marker's lifetime, and the job was never written.
#[tokio::test]
async fn a_refused_once_marker_enqueue_leaves_no_marker() {
    let mut outcomes = Vec::new();
    for case in ["bad run_at", "delayed", "main"] {
        let (_s, mut conn, keys) = setup().await;
        let id = JobId::from("p");
        let once = Enqueue {
            once_for: Some(Duration::from_secs(60)),
            delay: (case == "delayed").then_some(Duration::from_secs(60)),
            ..Enqueue::test_job(&keys, &id, 1)
        };
        let err = match case {
            "bad run_at" => {
                // Raw arguments: the wrapper cannot send a run_at of "x".
                raw_enqueue(&mut conn, &keys, "p", ["1", "0", "x", "60000"])
                    .await
                    .unwrap_err()
            }
            _ => {
                let key = if case == "main" {
                    &keys.main
                } else {
                    &keys.delayed
                };
                let _: () = conn.set(key, "x").await.unwrap();
                let err = once.run_with_token(&mut conn, "T").await.unwrap_err();
                let _: () = conn.del(key).await.unwrap();
                err
            }
        };
        let marker: i64 = conn.exists(keys.once("p")).await.unwrap();
        let hash: i64 = conn.exists(keys.job("p")).await.unwrap();
        // The call sent again (the data repaired): the job is written.
        let again = once.run_with_token(&mut conn, "T").await.unwrap();
        let expected = if case == "bad run_at" {
            "invalid argument run_at_ms"
        } else {
            "WRONGTYPE"
        };
        outcomes.push((
            case,
            err.to_string().contains(expected),
            marker,
            hash,
            matches!(again, EnqueueReply::Created { .. }),
        ));
    }
    assert_eq!(
        outcomes,
        [
            ("bad run_at", true, 0, 0, true),
            ("delayed", true, 0, 0, true),
            ("main", true, 0, 0, true)
        ],
        "(case, refused with the expected error, marker left, hash left, resent call is new)"
    );
}

/// Jobs a, b and c (a stable id, `fresh` off, whose job key holds a list:
/// corrupt data). Mode each: c answers invalid, a and b are enqueued (in
/// main). Mode all: the call is refused before any write. Before, c's HMGET
/// failed the call after a's and b's hashes were written but before the one
/// LPUSH of the call: a and b were lost (and a retry with the same tokens
/// answered `new` for them).
#[tokio::test]
async fn a_stable_id_whose_job_key_is_corrupt_does_not_lose_the_other_jobs() {
    for mode in [Mode::Each, Mode::All] {
        let (_s, mut conn, keys) = setup().await;
        let _: () = conn.rpush(keys.job("c"), "x").await.unwrap();
        let ids = job_ids(&["a", "b", "c"]);
        let jobs: Vec<ManyJob<'_>> = ids
            .iter()
            .map(|id| ManyJob {
                job: Enqueue::test_job(&keys, id, 1),
                token: "t",
                fresh: id.as_str() != "c",
            })
            .collect();
        let reply = run(&mut conn, &keys, mode, &jobs).await;
        let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
        let hashes: i64 = conn.exists(&[keys.job("a"), keys.job("b")]).await.unwrap();
        if mode == Mode::Each {
            let replies = reply.unwrap();
            assert_eq!(
                replies[2],
                ManyReply::Invalid("corrupt job key: holds a list, not a hash".into())
            );
            assert!(matches!(
                replies[..2],
                [
                    ManyReply::Enqueued(EnqueueReply::Created { .. }),
                    ManyReply::Enqueued(EnqueueReply::Created { .. })
                ]
            ));
            assert_eq!((main, hashes), (vec!["b".to_string(), "a".to_string()], 2));
            assert_eq!(enqueued_stat(&mut conn, &keys).await, 2);
        } else {
            let err = reply.unwrap_err();
            assert!(err.to_string().contains("corrupt job key"), "{err}");
            assert_eq!((main.len(), hashes), (0, 0));
        }
    }
}

/// A grouped job of an `enqueue_many` call whose group list or the ring
/// holds another type: in mode each that job answers invalid and the others
/// are enqueued; in mode all nothing is written. Before, push_waiting failed
/// mid-loop: the earlier jobs' hashes were written, main never pushed.
#[tokio::test]
async fn a_corrupt_group_list_or_ring_refuses_only_its_job_before_any_write() {
    let group = [pair("group", "G")];
    for corrupt in ["group list", "ring"] {
        for mode in [Mode::Each, Mode::All] {
            let (_s, mut conn, keys) = setup().await;
            corrupt_group_key(&mut conn, &keys, corrupt).await;
            let ids = job_ids(&["a", "g", "c"]);
            let jobs = shaped_fresh_jobs(&keys, &ids, |id, job| Enqueue {
                extra: if id.as_str() == "g" { &group } else { &[] },
                ..job
            });
            let reply = run(&mut conn, &keys, mode, &jobs).await;
            let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
            let g: i64 = conn.exists(keys.job("g")).await.unwrap();
            let g_listed: i64 = conn
                .exists(if corrupt == "ring" {
                    keys.group("G")
                } else {
                    keys.groups()
                })
                .await
                .unwrap();
            assert_eq!((g, g_listed), (0, 0), "{corrupt} {mode:?}");
            if mode == Mode::Each {
                let replies = reply.unwrap();
                assert!(
                    matches!(&replies[1], ManyReply::Invalid(r) if r.contains("WRONGTYPE")),
                    "{corrupt}: {replies:?}"
                );
                assert_eq!(main, ["c", "a"], "{corrupt}");
            } else {
                let err = reply.unwrap_err();
                assert!(err.to_string().contains("WRONGTYPE"), "{corrupt}: {err}");
                let hashes: i64 = conn.exists(&[keys.job("a"), keys.job("c")]).await.unwrap();
                assert_eq!((main.len(), hashes), (0, 0), "{corrupt}");
            }
        }
    }
}

/// A stable id whose completion record key holds a third type: that job is
/// refused (it used to answer "done": the job was never enqueued), the
/// others of the call are written.
#[tokio::test]
async fn a_record_key_of_a_third_type_refuses_its_job() {
    let (_s, mut conn, keys) = setup().await;
    let _: () = conn.rpush(keys.done("b"), "x").await.unwrap();
    let ids = job_ids(&["a", "b"]);
    let mut jobs = fresh_jobs(&keys, &ids);
    jobs[1].fresh = false;
    let replies = run(&mut conn, &keys, Mode::Each, &jobs).await.unwrap();
    assert!(
        matches!(&replies[1], ManyReply::Invalid(why) if why.contains("completion record key holds a list")),
        "{replies:?}"
    );
    let main: i64 = conn.llen(&keys.main).await.unwrap();
    assert_eq!(main, 1);
}

/// `enqueue.lua` with a max_attempts that is not a count (a producer in
/// another language, docs/PROTOCOL.md): refused with an error naming it,
/// nothing written. Before, the job was enqueued and dead-lettered at its
/// first claim ("corrupt field max_attempts").
#[tokio::test]
async fn enqueue_refuses_a_max_attempts_that_is_not_a_count() {
    let (_s, mut conn, keys) = setup().await;
    // Raw arguments: the wrapper sends a u32.
    let err = raw_enqueue(&mut conn, &keys, "m", ["many", "0", "0", "0"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_attempts"), "{err}");
    let written: i64 = conn
        .exists(&[keys.job("m"), keys.main.clone()])
        .await
        .unwrap();
    assert_eq!(written, 0);
}

/// An extra field name given twice (two `group` pairs) is refused before any
/// write by `enqueue.lua` and by `enqueue_many.lua` (the call in mode `all`,
/// that job in mode `each`). Before, the job waited in the first group's list
/// (`extra_group` reads the first pair) while its hash recorded the second
/// (the HSET keeps the last): cancel, check and repair looked in the other
/// group's list.
#[tokio::test]
async fn an_extra_field_given_twice_is_refused_before_any_write() {
    let (_s, mut conn, keys) = setup().await;
    let twice = [pair("group", "A"), pair("tenant", "t"), pair("group", "B")];
    let ids = job_ids(&["single", "a", "b"]);
    let err = Enqueue {
        extra: &twice,
        ..Enqueue::test_job(&keys, &ids[0], 1)
    }
    .run(&mut conn)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("given twice"), "{err}");
    let jobs = |twice_at: usize| -> Vec<ManyJob<'_>> {
        ids[1..]
            .iter()
            .enumerate()
            .map(|(i, id)| ManyJob {
                job: Enqueue {
                    extra: if i == twice_at { &twice } else { &[] },
                    ..Enqueue::test_job(&keys, id, 1)
                },
                token: "t",
                fresh: false,
            })
            .collect()
    };
    let err = run(&mut conn, &keys, Mode::All, &jobs(0))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("given twice"), "{err}");
    let written: i64 = conn
        .exists(&[
            keys.job("single"),
            keys.job("a"),
            keys.job("b"),
            keys.group("A"),
            keys.group("B"),
        ])
        .await
        .unwrap();
    assert_eq!((written, enqueued_stat(&mut conn, &keys).await), (0, 0));
    let replies = run(&mut conn, &keys, Mode::Each, &jobs(0)).await.unwrap();
    assert!(
        matches!(&replies[..], [ManyReply::Invalid(why), ManyReply::Enqueued(EnqueueReply::Created { .. })] if why.contains("given twice")),
        "{replies:?}"
    );
    let groups: i64 = conn
        .exists(&[keys.job("a"), keys.group("A"), keys.group("B")])
        .await
        .unwrap();
    assert_eq!(groups, 0);
    let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
    assert_eq!(main, ["b"]);
}

/// A generated id sent `fresh` (its key is not read) whose job key holds a
/// string (corrupt data), due now or delayed with a once-marker. Mode each:
/// that job answers invalid naming its key, its marker is removed, and the
/// others are written whole (hash and list), in mode all too (the refusal
/// is found by the job's first write; a check of every fresh key first cost
/// 7% of the script). Mode all with that job alone (a group commit resends
/// an invalid job alone in mode all): an error reply naming the job,
/// nothing written.
/// `enqueue.lua` reads every id: refused before any write too. Before, the
/// fresh job's HSET raised after the earlier jobs' hashes were written and
/// before the LPUSH of the call: a job in no list, and a retry with the same
/// tokens answered `new` for it.
#[tokio::test]
async fn a_fresh_id_whose_job_key_is_corrupt_does_not_lose_the_other_jobs() {
    for delayed in [false, true] {
        for (mode, alone) in [(Mode::Each, false), (Mode::All, false), (Mode::All, true)] {
            let case = format!("delayed {delayed}, {mode:?}, alone {alone}");
            let (_s, mut conn, keys) = setup().await;
            let _: () = conn.set(keys.job("c"), "x").await.unwrap();
            let ids = job_ids(if alone { &["c"] } else { &["a", "c", "b"] });
            let jobs = shaped_fresh_jobs(&keys, &ids, |id, job| Enqueue {
                once_for: (id.as_str() == "c").then_some(Duration::from_secs(60)),
                delay: (delayed && id.as_str() == "c").then_some(Duration::from_secs(60)),
                ..job
            });
            let reply = run(&mut conn, &keys, mode, &jobs).await;
            let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
            let hashes: i64 = conn.exists(&[keys.job("a"), keys.job("b")]).await.unwrap();
            let c: String = conn.get(keys.job("c")).await.unwrap();
            let marker: i64 = conn.exists(keys.once("c")).await.unwrap();
            let in_delayed: i64 = conn.zcard(&keys.delayed).await.unwrap();
            assert_eq!((c.as_str(), marker, in_delayed), ("x", 0, 0), "{case}");
            if !alone {
                let replies = reply.unwrap();
                assert_eq!(
                    replies[1],
                    ManyReply::Invalid("corrupt job key: holds a string, not a hash".into()),
                    "{case}"
                );
                assert!(
                    matches!(
                        replies[..],
                        [
                            ManyReply::Enqueued(EnqueueReply::Created { .. }),
                            _,
                            ManyReply::Enqueued(EnqueueReply::Created { .. })
                        ]
                    ),
                    "{case}: {replies:?}"
                );
                assert_eq!((main, hashes), (vec!["b".to_string(), "a".to_string()], 2));
                assert_eq!(enqueued_stat(&mut conn, &keys).await, 2, "{case}");
            } else {
                let err = reply.unwrap_err();
                assert!(
                    err.to_string()
                        .contains("job c: corrupt job key: holds a string"),
                    "{case}: {err}"
                );
                assert_eq!((main.len(), hashes), (0, 0), "{case}");
                assert_eq!(enqueued_stat(&mut conn, &keys).await, 0, "{case}");
            }
            // enqueue.lua (no `fresh`: it reads every id) refuses it before
            // any write as well.
            let one = &jobs[if alone { 0 } else { 1 }].job;
            assert!(one.run_with_token(&mut conn, "T").await.is_err(), "{case}");
            let marker: i64 = conn.exists(keys.once("c")).await.unwrap();
            let in_delayed: i64 = conn.zcard(&keys.delayed).await.unwrap();
            assert_eq!((marker, in_delayed), (0, 0), "{case}: enqueue.lua");
        }
    }
}

/// Schema versions a worker cannot read from the claim row (a u32 in
/// decimal): what a producer in another language may send.
const UNREADABLE_VERSIONS: [&str; 7] = ["1.0", "v2", "-1", "4294967296", "", "1e3", " 1"];

/// `enqueue_many.lua` in `mode` (`each` or `all`) for jobs `j0`, `j1`, ...,
/// one per raw schema version of `versions` (type `t`, empty payload, a
/// stable id, token `T`).
async fn raw_many(
    conn: &mut RedisConnection,
    keys: &QueueKeys,
    mode: &str,
    versions: &[&str],
) -> crate::Result<redis::Value> {
    let mut call = super::enqueue_many::call_head(keys, mode);
    for (i, v) in versions.iter().enumerate() {
        call = call
            .repeated_arg(format!("j{i}"))
            .repeated_arg("t")
            .repeated_arg(*v)
            .repeated_arg("")
            .repeated_arg(3)
            .repeated_arg(0)
            .repeated_arg(0)
            .repeated_arg(0)
            .repeated_arg("T")
            .repeated_arg("0")
            .repeated_arg(0);
    }
    call.run(conn, &keys.queue, None).await
}

/// `enqueue.lua` with a schema version a worker cannot read ("1.0" from a
/// JSON float, "v2", a number past u32): refused with an error naming it,
/// nothing written. The largest u32 and 0 (an old version no handler knows,
/// dead-lettered as such) are written. Before, the version was stored
/// unchecked: the script answered `new`, the claim row of the job did not
/// decode and the worker dead-lettered it as an unreadable claim row (a
/// replay failed the same way).
#[tokio::test]
async fn enqueue_refuses_a_schema_version_a_worker_cannot_read() {
    let (_s, mut conn, keys) = setup().await;
    for v in UNREADABLE_VERSIONS {
        let err = raw_enqueue_as(&mut conn, &keys, "bad", v, ["3", "0", "0", "0"])
            .await
            .expect_err(v);
        assert!(err.to_string().contains("schema version"), "{v:?}: {err}");
        let written: i64 = conn
            .exists(&[keys.job("bad"), keys.main.clone()])
            .await
            .unwrap();
        assert_eq!(written, 0, "{v:?}");
    }
    for v in ["4294967295", "0", "7"] {
        let id = format!("ok-{v}");
        raw_enqueue_as(&mut conn, &keys, &id, v, ["3", "0", "0", "0"])
            .await
            .unwrap_or_else(|e| panic!("{v}: {e}"));
        let stored: Option<String> = conn.hget(keys.job(&id), "v").await.unwrap();
        assert_eq!(stored.as_deref(), Some(v));
    }
    assert_eq!(enqueued_stat(&mut conn, &keys).await, 3);
}

/// `enqueue_many.lua` with a job whose schema version a worker cannot read:
/// mode `each` answers `invalid` (naming the version) for that job and
/// writes the others; mode `all` refuses the call, nothing written. Before,
/// every job was written (see the test above).
#[tokio::test]
async fn enqueue_many_refuses_a_schema_version_a_worker_cannot_read() {
    let (_s, mut conn, keys) = setup().await;
    for v in UNREADABLE_VERSIONS {
        let err = raw_many(&mut conn, &keys, "all", &["1", v, "2"])
            .await
            .expect_err(v);
        assert!(
            err.to_string().contains("job j1: schema version"),
            "{v:?}: {err}"
        );
        let written: i64 = conn
            .exists(&[
                keys.job("j0"),
                keys.job("j1"),
                keys.job("j2"),
                keys.main.clone(),
            ])
            .await
            .unwrap();
        assert_eq!(written, 0, "{v:?}");
    }
    for v in UNREADABLE_VERSIONS {
        let reply = raw_many(&mut conn, &keys, "each", &["1", v, "2"])
            .await
            .unwrap_or_else(|e| panic!("{v:?}: {e}"));
        let rows: Vec<Vec<String>> = super::reply::array(&reply)
            .unwrap()
            .iter()
            .map(|row| {
                super::reply::array(row)
                    .unwrap()
                    .iter()
                    .map(|f| super::reply::text(f).unwrap_or_default())
                    .collect()
            })
            .collect();
        let kinds: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
        assert_eq!(kinds, ["new", "invalid", "new"], "{v:?}: {rows:?}");
        assert!(rows[1][1].contains("schema version"), "{v:?}: {rows:?}");
        let j1: i64 = conn.exists(keys.job("j1")).await.unwrap();
        assert_eq!(j1, 0, "{v:?}");
        // The next round finds j0 and j2 written (`new` again: their token).
    }
    let main: Vec<String> = conn.lrange(&keys.main, 0, -1).await.unwrap();
    assert_eq!(main, ["j2", "j0"]);
    for (id, v) in [("j0", "1"), ("j2", "2")] {
        let stored: Option<String> = conn.hget(keys.job(id), "v").await.unwrap();
        assert_eq!(stored.as_deref(), Some(v));
    }
}
