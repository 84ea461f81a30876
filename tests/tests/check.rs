//! The invariant checker (`Admin::check`) against a real redis-server: clean
//! after a normal run, every seeded violation found, and `repair` mending
//! the repairable ones without losing a job.

use std::collections::BTreeSet;
use std::time::Duration;

use queue_core::admin::{Admin, RepairAction, Violation, MISSING_HASH_REASON};
use queue_core::{EnqueueOptions, QueueKeys};
use queue_testkit::RedisServer;
use queue_tests::{fast_config, init_tracing, spawn_worker, task, wait_until, Task};

const T: Duration = Duration::from_secs(30);
const Q: &str = "tasks";

async fn setup() -> (RedisServer, Admin) {
    init_tracing();
    let server = RedisServer::start().expect("redis-server starts");
    let admin = Admin::connect(&server.url()).await.expect("connect");
    (server, admin)
}

/// Runs one raw command, to seed a state no script creates.
fn raw(server: &RedisServer, args: &[&str]) {
    server.command(args).expect("raw command");
}

async fn enqueue(admin: &Admin, id: &str) {
    admin
        .queue()
        .enqueue_raw(Q, "task", 1, 3, EnqueueOptions::new().id(id), b"\x80")
        .await
        .expect("enqueue");
}

/// `(kind, job id or key)` of each violation, sorted.
fn found(violations: &[Violation]) -> BTreeSet<(String, String)> {
    violations
        .iter()
        .map(|v| {
            let what = match v {
                Violation::WrongKeyType { key, .. }
                | Violation::CorruptGroupRing { key, .. }
                | Violation::CorruptGroupPause { key, .. } => key.clone(),
                Violation::BadCounter { field, .. } => field.clone(),
                Violation::GroupOutOfRing { group, .. }
                | Violation::CorruptGroupList { group, .. } => group.clone(),
                other => other.job_id().map(|i| i.to_string()).unwrap_or_default(),
            };
            (v.kind().to_string(), what)
        })
        .collect()
}

fn set(items: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    items
        .iter()
        .map(|(k, i)| (k.to_string(), i.to_string()))
        .collect()
}

#[tokio::test]
async fn a_queue_is_clean_after_a_normal_run_with_retries_and_dead_letters() {
    let (server, admin) = setup().await;
    let url = server.url();
    let queue = admin.queue().clone();
    for seq in 0..30u64 {
        let t = Task {
            ledger: url.clone(),
            seq,
            fail_first: (seq % 3 == 0) as u32,
            permanent: seq % 10 == 7,
            ..Task::default()
        };
        task::enqueue(&queue, t).await.expect("enqueue");
    }
    let (stop, join) = spawn_worker(&url, fast_config()).await;
    wait_until(T, "every job completed or dead-lettered", || async {
        let s = queue.stats(Q).await.unwrap();
        s.counter("completed") as u64 + s.dead == 30
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();

    let report = admin.check(Q, false).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.scanned.dead, 3);
    assert_eq!(report.scanned.job_keys, 3, "only the dead jobs keep a hash");
    assert_eq!(report.scanned.probed, 0, "nothing looked suspicious");
}

#[tokio::test]
async fn an_unclaimed_processing_entry_and_live_jobs_are_not_violations() {
    let (server, admin) = setup().await;
    let k = QueueKeys::new(Q);
    for id in ["a", "b", "c"] {
        enqueue(&admin, id).await;
    }
    // A worker died between BLMOVE and its claim: in processing, state queued, no lease.
    raw(&server, &["LMOVE", &k.main, &k.processing, "RIGHT", "LEFT"]);
    admin
        .queue()
        .enqueue_raw(
            Q,
            "task",
            1,
            3,
            EnqueueOptions::new()
                .id("later")
                .delay(Duration::from_secs(60)),
            b"\x80",
        )
        .await
        .unwrap();
    let report = admin.check(Q, false).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(
        (report.scanned.main, report.scanned.processing),
        (2, 1),
        "{report:?}"
    );
}

/// Seeds one of each violation into queue `tasks` (plus healthy jobs around them).
async fn seed_violations(server: &RedisServer, admin: &Admin) {
    let k = QueueKeys::new(Q);
    for id in ["ok1", "ok2", "dup", "mismatch", "corrupt", "unleased"] {
        enqueue(admin, id).await;
    }
    // A job hash listed nowhere (its id fell out of the lists).
    enqueue(admin, "orphan").await;
    raw(server, &["LREM", &k.main, "1", "orphan"]);
    // A dead job hash listed nowhere.
    raw(
        server,
        &[
            "HSET",
            &k.job("orphan-dead"),
            "id",
            "orphan-dead",
            "state",
            "dead",
        ],
    );
    // Entries whose hash is gone: one never completed, one completed.
    raw(server, &["LPUSH", &k.main, "evicted"]);
    raw(server, &["ZADD", &k.delayed, "1", "finished"]);
    raw(server, &["HSET", &k.done("finished"), "status", "done"]);
    // Listed twice.
    raw(server, &["LPUSH", &k.dead, "dup"]);
    // State disagrees with the structure.
    raw(server, &["HSET", &k.job("mismatch"), "state", "delayed"]);
    // Corrupt attempts.
    raw(server, &["HSET", &k.job("corrupt"), "attempts", "nan"]);
    // Claimed without a lease.
    raw(server, &["LREM", &k.main, "1", "unleased"]);
    raw(server, &["LPUSH", &k.processing, "unleased"]);
    raw(
        server,
        &["HSET", &k.job("unleased"), "state", "active", "token", "t"],
    );
    // A lease of an id not in processing.
    raw(server, &["ZADD", &k.leases, "1", "ok2"]);
    // A counter that is not a non-negative integer.
    raw(server, &["HSET", &k.stats, "completed", "-3"]);
    // A group with a job waiting, neither in the ring nor paused.
    admin
        .queue()
        .enqueue_raw(
            Q,
            "task",
            1,
            3,
            EnqueueOptions::new().group("lost"),
            b"\x80",
        )
        .await
        .expect("grouped enqueue");
    raw(server, &["DEL", &k.groups()]);
}

#[tokio::test]
async fn every_seeded_violation_is_found() {
    let (server, admin) = setup().await;
    seed_violations(&server, &admin).await;
    let report = admin.check(Q, false).await.unwrap();
    assert_eq!(
        found(&report.violations),
        set(&[
            ("active_without_lease", "unleased"),
            ("bad_counter", "completed"),
            ("corrupt_field", "corrupt"),
            ("duplicate", "dup"),
            ("group_out_of_ring", "lost"),
            ("missing_hash", "evicted"),
            ("missing_hash", "finished"),
            ("orphan_hash", "orphan"),
            ("orphan_hash", "orphan-dead"),
            ("state_mismatch", "mismatch"),
            ("stray_lease", "ok2"),
        ]),
        "{:#?}",
        report.violations
    );
    assert!(report.repairs.is_empty(), "no repair without --repair");
    // Read-only: a second check finds the same.
    let again = admin.check(Q, false).await.unwrap();
    assert_eq!(found(&again.violations), found(&report.violations));
}

#[tokio::test]
async fn a_structure_of_the_wrong_type_is_reported_without_reading_further() {
    let (server, admin) = setup().await;
    let k = QueueKeys::new(Q);
    enqueue(&admin, "a").await;
    raw(&server, &["SET", &k.dead, "oops"]);
    raw(&server, &["SET", &k.job("b"), "oops"]);
    let report = admin.check(Q, false).await.unwrap();
    assert_eq!(
        found(&report.violations),
        set(&[("wrong_key_type", &k.dead)])
    );

    raw(&server, &["DEL", &k.dead]);
    raw(&server, &["LPUSH", &k.main, "b"]);
    let report = admin.check(Q, false).await.unwrap();
    assert_eq!(
        found(&report.violations),
        set(&[("wrong_key_type", &k.job("b"))]),
        "{:#?}",
        report.violations
    );
}

/// A group's waiting list of another type (corrupt data: a fetch skips the
/// group and leaves it in the ring) is reported with its group, key and type,
/// and the check goes on: the job hash it listed is an orphan, and a group
/// read after it is still judged. Before, `check` failed with a bare
/// WRONGTYPE from paging the list.
#[tokio::test]
async fn a_group_list_of_another_type_is_reported_and_the_check_goes_on() {
    let (server, admin) = setup().await;
    let k = QueueKeys::new(Q);
    for (id, group) in [("in-bad", "bad"), ("in-lost", "lost")] {
        admin
            .queue()
            .enqueue_raw(
                Q,
                "task",
                1,
                3,
                EnqueueOptions::new().id(id).group(group),
                b"\x80",
            )
            .await
            .expect("grouped enqueue");
    }
    raw(&server, &["DEL", &k.group("bad")]);
    raw(&server, &["SET", &k.group("bad"), "oops"]);
    // "lost" (read after "bad") is out of the ring, "bad" still in it.
    raw(&server, &["LREM", &k.groups(), "0", "lost"]);
    let report = admin.check(Q, false).await.expect("no WRONGTYPE");
    assert_eq!(
        found(&report.violations),
        set(&[
            ("corrupt_group_list", "bad"),
            ("group_out_of_ring", "lost"),
            ("orphan_hash", "in-bad"),
        ]),
        "{:#?}",
        report.violations
    );
    assert!(report.violations.contains(&Violation::CorruptGroupList {
        group: "bad".into(),
        key: k.group("bad"),
        found: "string".into(),
    }));
    assert_eq!(report.scanned.main, 1, "lost's job was read");

    // `--repair`: the hash the corrupt list held cannot go back into it
    // (refused, said why), and the other repairs still run: "lost" is put
    // back in the ring. Before, the refusal ended the whole repair with an
    // error.
    let report = admin.check(Q, true).await.expect("repairs go on");
    let refused = report
        .repairs
        .iter()
        .find(|r| r.id.as_ref().map(|i| i.as_str()) == Some("in-bad"))
        .unwrap_or_else(|| panic!("{:#?}", report.repairs));
    assert_eq!(refused.action, RepairAction::Refused);
    assert!(
        refused
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("WRONGTYPE") || d.contains("type")),
        "{refused:?}"
    );
    assert!(
        report
            .repairs
            .iter()
            .any(|r| r.group.as_deref() == Some("lost") && r.action == RepairAction::AddedToRing),
        "{:#?}",
        report.repairs
    );
}

/// The group ring or the group pause hash holding another type (corrupt
/// data: a fetch then serves main only, or reads no group as paused) is
/// reported with its key and type, and the check goes on: the groups' jobs
/// and main are still read, an entry without a hash still found. Before,
/// `check` reported nothing.
#[tokio::test]
async fn a_group_ring_or_pause_hash_of_another_type_is_reported_and_the_check_goes_on() {
    let (server, admin) = setup().await;
    let k = QueueKeys::new(Q);
    admin
        .queue()
        .enqueue_raw(
            Q,
            "task",
            1,
            3,
            EnqueueOptions::new().id("in-a").group("a"),
            b"\x80",
        )
        .await
        .expect("grouped enqueue");
    enqueue(&admin, "plain").await;
    raw(&server, &["DEL", &k.groups()]);
    raw(&server, &["SET", &k.groups(), "oops"]);
    raw(&server, &["SET", &k.groups_paused(), "oops"]);
    raw(&server, &["LPUSH", &k.main, "ghost"]);
    let report = admin.check(Q, false).await.expect("check answers");
    let (ring, paused) = (k.groups(), k.groups_paused());
    assert_eq!(
        found(&report.violations),
        set(&[
            ("corrupt_group_ring", &ring),
            ("corrupt_group_pause", &paused),
            ("missing_hash", "ghost"),
        ]),
        "{:#?}",
        report.violations
    );
    assert!(report.violations.contains(&Violation::CorruptGroupRing {
        key: k.groups(),
        found: "string".into(),
    }));
    assert_eq!(report.scanned.main, 3, "main and group a were read");
    // Repair leaves both keys to the operator.
    let repaired = admin.check(Q, true).await.unwrap();
    assert!(
        repaired.repairs.iter().all(|r| r.group.is_none()),
        "{:?}",
        repaired.repairs
    );
    let kept = server.command(&["TYPE", &k.groups()]).unwrap();
    assert!(kept.contains("string"), "{kept}");
}

#[tokio::test]
async fn repair_mends_the_repairable_violations_without_losing_a_job() {
    let (server, admin) = setup().await;
    seed_violations(&server, &admin).await;
    let report = admin.check(Q, true).await.unwrap();
    let repairs: BTreeSet<(String, RepairAction)> = report
        .repairs
        .iter()
        .map(|r| {
            let what = r.id.as_ref().map(ToString::to_string).or(r.group.clone());
            (what.unwrap_or_default(), r.action)
        })
        .collect();
    let want: BTreeSet<(String, RepairAction)> = [
        ("orphan", RepairAction::RequeuedToMain),
        ("orphan-dead", RepairAction::RestoredToDead),
        ("evicted", RepairAction::DeadLettered),
        ("finished", RepairAction::RemovedCompleted),
        ("ok2", RepairAction::LeaseDropped),
        ("lost", RepairAction::AddedToRing),
    ]
    .into_iter()
    .map(|(i, a)| (i.to_string(), a))
    .collect();
    assert_eq!(repairs, want);

    // What is left needs an operator; every job is still somewhere.
    let after = admin.check(Q, false).await.unwrap();
    assert_eq!(
        found(&after.violations),
        set(&[
            ("active_without_lease", "unleased"),
            ("bad_counter", "completed"),
            ("corrupt_field", "corrupt"),
            ("duplicate", "dup"),
            ("state_mismatch", "mismatch"),
        ]),
        "{:#?}",
        after.violations
    );
    use queue_core::admin::Location;
    for (id, want) in [
        ("orphan", "main"),
        ("orphan-dead", "dead"),
        ("evicted", "dead"),
        ("ok1", "main"),
        ("ok2", "main"),
    ] {
        let at = admin.locate(Q, id).await.unwrap();
        let place = match at {
            Some(Location::Main { .. }) => "main",
            Some(Location::Dead { .. }) => "dead",
            other => panic!("{id}: {other:?}"),
        };
        assert_eq!(place, want, "{id}");
    }
    let evicted = admin.queue().job(Q, "evicted").await.unwrap().unwrap();
    assert_eq!(evicted.field("dead_reason"), Some(MISSING_HASH_REASON));
    assert_eq!(
        admin.locate(Q, "finished").await.unwrap(),
        Some(Location::Completed)
    );
    // The requeued orphan runs like any job.
    let (stop, join) = spawn_worker(&server.url(), fast_config()).await;
    wait_until(T, "the requeued orphan completed", || async {
        matches!(
            admin.locate(Q, "orphan").await.unwrap(),
            Some(Location::Completed) | Some(Location::Dead { .. })
        )
    })
    .await;
    stop.shutdown();
    join.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_check_during_live_traffic_reports_nothing() {
    let (server, admin) = setup().await;
    let url = server.url();
    let queue = admin.queue().clone();
    let jobs = 400u64;
    for seq in 0..jobs {
        let t = Task {
            ledger: url.clone(),
            seq,
            fail_first: (seq % 4 == 0) as u32,
            sleep_ms: 2,
            ..Task::default()
        };
        task::enqueue(&queue, t).await.expect("enqueue");
    }
    let config = queue_core::WorkerConfig {
        concurrency: 8,
        ..fast_config()
    };
    let (stop, join) = spawn_worker(&url, config).await;
    // Jobs move between main, processing and delayed while the pages are
    // read: every id that looks misplaced on a page is probed atomically, and
    // a live job is never reported.
    let mut checks = 0;
    let mut probed = 0;
    loop {
        let s = queue.stats(Q).await.unwrap();
        let done = s.counter("completed") as u64 == jobs;
        let report = admin.check(Q, false).await.unwrap();
        assert!(report.is_clean(), "{:#?}", report.violations);
        checks += 1;
        probed += report.scanned.probed;
        if done {
            break;
        }
    }
    stop.shutdown();
    join.await.unwrap().unwrap();
    println!("{checks} checks during the run, {probed} ids probed");
    assert!(checks >= 3, "the run was too short to check during it");
}
