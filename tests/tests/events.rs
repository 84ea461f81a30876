//! Job history and the per-queue event stream (docs/EVENTS.md), against a
//! real redis-server: the history of a job that was retried, returned by the
//! watchdog, dead-lettered and replayed across three worker processes; the
//! stream's order for one job across two workers; the stream's cap; and a
//! queue with events off writes no stream and a happy-path job no history.

use futures::StreamExt;
use queue_core::admin::Admin;
use queue_core::{EventKind, EventsFrom, JobId, QueueEvent, QueueKeys};
use queue_tests::env::{TestEnv, BOUND};
use queue_tests::{fast_config, task, wait_until, Task, WorkerProcess};
use redis::AsyncCommands;

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");
const QUEUE: &str = "tasks";

async fn started(env: &TestEnv, id: &JobId) -> u32 {
    let h: std::collections::HashMap<String, u32> = env.ledger_hash("ledger:started").await;
    h.get(id.as_str()).copied().unwrap_or(0)
}

async fn wait_started(env: &TestEnv, id: &JobId, n: u32) {
    wait_until(BOUND, &format!("attempt {n} started"), || async {
        started(env, id).await >= n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_lists_a_retry_a_lease_return_dead_letter_and_replay() {
    let env = TestEnv::start().await;
    let admin = Admin::new(env.queue.clone());
    let _watchdog = env.spawn_watchdog(QUEUE).await;
    // Attempt 1 fails; attempts 2 and 3 sleep and their worker is killed.
    let id = env
        .enqueue(Task {
            fail_first: 1,
            sleep_ms: 60_000,
            sleep_attempts: 3,
            ..env.task(1)
        })
        .await;
    let mut w1 = WorkerProcess::start(WORKER_BIN, &env.url, 2, 900, 1000);
    wait_started(&env, &id, 2).await;
    w1.kill();
    // The watchdog returns attempt 2 (2 of 3); the next process runs attempt 3.
    let mut w2 = WorkerProcess::start(WORKER_BIN, &env.url, 2, 900, 1000);
    wait_started(&env, &id, 3).await;
    w2.kill();
    // Attempt 3 of 3: its lease return dead-letters it.
    env.wait_stats(QUEUE, "dead-lettered", |s| s.dead == 1)
        .await;
    assert!(admin
        .queue()
        .replay_dead(QUEUE, &id, false)
        .await
        .expect("replay"));
    let _w3 = WorkerProcess::start(WORKER_BIN, &env.url, 2, 900, 1000);
    env.wait_completed(QUEUE, 1).await;

    let history = admin.job_history(QUEUE, &id).await.expect("history");
    let kinds: Vec<&str> = history.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "enqueued",
            "retried",
            "reclaimed",
            "dead",
            "replayed",
            "completed"
        ],
        "{history:#?}"
    );
    let attempts: Vec<Option<u32>> = history.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts[1..4], [Some(1), Some(2), Some(3)]);
    assert_eq!(attempts[5], Some(4));
    // Each delivery names its worker and start; three processes ran them.
    for e in [&history[1], &history[2], &history[3], &history[5]] {
        assert!(e.worker.is_some() && e.started_at.is_some(), "{e:?}");
        assert!(e.started_at <= Some(e.at), "{e:?}");
    }
    assert_eq!(
        history[1].worker, history[2].worker,
        "attempts 1 and 2 on w1"
    );
    assert_ne!(history[2].worker, history[3].worker, "attempt 3 on w2");
    assert_ne!(history[3].worker, history[5].worker, "attempt 4 on w3");
    assert!(history[1]
        .detail
        .as_deref()
        .is_some_and(|d| d.contains("planned failure")));
    assert!(history[3]
        .detail
        .as_deref()
        .is_some_and(|d| d.contains("attempts exhausted")));
    // The same through job_detail (what `jobs show` and the dashboard print).
    let detail = admin.job_detail(QUEUE, &id).await.unwrap().unwrap();
    assert_eq!(detail.journal, history);
    // Completed: the history expires with the completion record.
    let mut c = env.conn().await;
    let ttl: i64 = c
        .pttl(QueueKeys::new(QUEUE).hist(id.as_str()))
        .await
        .unwrap();
    let done_ttl: i64 = c
        .pttl(QueueKeys::new(QUEUE).done(id.as_str()))
        .await
        .unwrap();
    assert!(
        ttl > 0 && (done_ttl - ttl).abs() < 5_000,
        "{ttl} vs {done_ttl}"
    );
}

/// Reads events of `stream` until job `id` completed.
async fn events_of(
    stream: &mut futures::stream::BoxStream<'static, queue_core::Result<QueueEvent>>,
    id: &JobId,
) -> Vec<QueueEvent> {
    let mut out = Vec::new();
    tokio::time::timeout(BOUND, async {
        while let Some(e) = stream.next().await {
            let e = e.expect("event");
            if &e.job_id == id {
                let done = e.kind == EventKind::Completed;
                out.push(e);
                if done {
                    break;
                }
            }
        }
    })
    .await
    .expect("the job's events within the bound");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_has_a_jobs_events_in_order_across_two_workers() {
    let env = TestEnv::start().await;
    env.queue.set_events(QUEUE, true).await.unwrap();
    let mut stream = env.queue.events(QUEUE, EventsFrom::Now).await.unwrap();
    let _w1 = env.spawn_worker(fast_config()).await;
    let _w2 = env.spawn_worker(fast_config()).await;
    let id = env
        .enqueue(Task {
            fail_first: 1,
            ..env.task(1)
        })
        .await;
    let events = events_of(&mut stream, &id).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["enqueued", "started", "retried", "started", "completed"]
    );
    let attempts: Vec<Option<u32>> = events.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts[1..], [Some(1), Some(1), Some(2), Some(2)]);
    assert!(events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    assert!(events[1].worker.is_some() && events[3].worker.is_some());
    assert!(events[2]
        .detail
        .as_deref()
        .is_some_and(|d| d.contains("planned failure")));
    // A reader that resumes after the first event gets the rest.
    let rest = env
        .queue
        .read_events(QUEUE, &events[0].stream_id, 100)
        .await
        .unwrap();
    let rest: Vec<&QueueEvent> = rest.iter().filter(|e| e.job_id == id).collect();
    assert_eq!(rest.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_is_capped() {
    let env = TestEnv::start().await;
    env.queue.set_events_maxlen(QUEUE, 100).await.unwrap();
    for chunk in 0..10 {
        let tasks: Vec<Task> = (0..200).map(|i| env.task(chunk * 200 + i)).collect();
        task::enqueue_many(&env.queue, &tasks).await.unwrap();
    }
    let mut c = env.conn().await;
    let len: u64 = redis::cmd("XLEN")
        .arg(QueueKeys::new(QUEUE).events())
        .query_async(&mut c)
        .await
        .unwrap();
    // MAXLEN ~ trims whole stream nodes (100 entries each by default).
    assert!((100..=200).contains(&len), "XLEN {len}");
    let last = env.queue.last_events(QUEUE, 1).await.unwrap();
    assert_eq!(last[0].kind, EventKind::Enqueued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_off_write_no_stream_and_a_happy_job_no_history() {
    let env = TestEnv::start().await;
    assert_eq!(env.queue.events_maxlen(QUEUE).await.unwrap(), None);
    let happy = env.enqueue(env.task(1)).await;
    let retried = env
        .enqueue(Task {
            fail_first: 1,
            ..env.task(2)
        })
        .await;
    env.run_until_completed(QUEUE, 2).await;
    let k = QueueKeys::new(QUEUE);
    let mut c = env.conn().await;
    let exists = |key: String| {
        let mut c = c.clone();
        async move { c.exists::<_, bool>(key).await.unwrap() }
    };
    assert!(!exists(k.events()).await, "events off: no stream");
    assert!(
        !exists(k.hist(happy.as_str())).await,
        "happy path: no history list"
    );
    assert!(exists(k.hist(retried.as_str())).await);
    // The happy path is read back from the completion record.
    let admin = Admin::new(env.queue.clone());
    let h = admin.job_history(QUEUE, &happy).await.unwrap();
    let kinds: Vec<&str> = h.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["enqueued", "completed"]);
    assert!(h[1].worker.is_some() && h[1].started_at.is_some(), "{h:?}");
    // Turned off again after being on: nothing more is written.
    env.queue.set_events(QUEUE, true).await.unwrap();
    env.enqueue(env.task(3)).await;
    env.queue.set_events(QUEUE, false).await.unwrap();
    env.enqueue(env.task(4)).await;
    let len: u64 = redis::cmd("XLEN")
        .arg(k.events())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(len, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_stream_keys_of_another_type_never_block_a_job() {
    let env = TestEnv::start().await;
    env.queue.set_events(QUEUE, true).await.unwrap();
    let k = QueueKeys::new(QUEUE);
    let mut c = env.conn().await;
    let _: () = c.set(k.events(), "not a stream").await.unwrap();
    let id = env
        .enqueue(Task {
            fail_first: 1,
            ..env.task(1)
        })
        .await;
    let _: () = c.set(k.hist(id.as_str()), "not a list").await.unwrap();
    // The retry's history write and every event fail inside their pcall:
    // the job still retries and completes.
    env.run_until_completed(QUEUE, 1).await;
    assert_eq!(env.completion_attempts(QUEUE, &id).await, 2);
    let kept: String = c.get(k.events()).await.unwrap();
    assert_eq!(kept, "not a stream");
}

/// Adds `n` entries another writer made to `QUEUE`'s stream: no `event` or
/// `id` field, so this version decodes none of them.
async fn add_foreign_entries(env: &TestEnv, n: usize) {
    let mut c = env.conn().await;
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("XADD")
            .arg(QueueKeys::new(QUEUE).events())
            .arg("*")
            .arg("other")
            .arg(i)
            .ignore();
    }
    let _: () = pipe.query_async(&mut c).await.unwrap();
}

/// The next event of `stream`, within the bound.
async fn next_event(
    stream: &mut futures::stream::BoxStream<'static, queue_core::Result<QueueEvent>>,
) -> QueueEvent {
    tokio::time::timeout(BOUND, stream.next())
        .await
        .expect("an event within the bound")
        .expect("the stream goes on")
        .expect("event")
}

/// Scenario: more entries than one read takes (300) that this version does
/// not decode, then a real event. The stream moves past them and yields the
/// event. Before, it stayed before the first of them: every `XREAD` answered
/// the same 256 entries at once, nothing was yielded, and the reader spun on
/// Redis for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_entries_that_do_not_decode_never_stalls_the_stream() {
    let env = TestEnv::start().await;
    env.queue.set_events(QUEUE, true).await.unwrap();
    let mut stream = env.queue.events(QUEUE, EventsFrom::Start).await.unwrap();
    add_foreign_entries(&env, 300).await;
    let id = env.enqueue(env.task(1)).await;
    let e = next_event(&mut stream).await;
    assert_eq!((e.kind, e.job_id), (EventKind::Enqueued, id));
}

/// Scenario: the newest entry of the stream is one this version does not
/// decode when a reader starts from `Now`. It gets only what is added after,
/// not the history. Before, `Now` resolved to the newest *decoded* entry (or
/// the start when none): the history was replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_from_now_after_a_foreign_newest_entry_are_only_new_ones() {
    let env = TestEnv::start().await;
    env.queue.set_events(QUEUE, true).await.unwrap();
    env.enqueue(env.task(1)).await;
    add_foreign_entries(&env, 1).await;
    let mut stream = env.queue.events(QUEUE, EventsFrom::Now).await.unwrap();
    let new = env.enqueue(env.task(2)).await;
    let e = next_event(&mut stream).await;
    assert_eq!((e.kind, e.job_id), (EventKind::Enqueued, new));
}

/// Scenario: an event, then a page's worth and more (30) of entries this
/// version does not decode, then another event. Paging with
/// `read_events_page`'s cursor (10 entries a page) reaches the second
/// event. `read_events` after the first event answers nothing (the 10
/// entries it read do not decode), which a reader took for "nothing new":
/// it never got past them (before, that was the only paging there was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_with_the_cursor_gets_past_a_page_of_entries_that_do_not_decode() {
    let env = TestEnv::start().await;
    env.queue.set_events(QUEUE, true).await.unwrap();
    let j1 = env.enqueue(env.task(1)).await;
    add_foreign_entries(&env, 30).await;
    let j2 = env.enqueue(env.task(2)).await;

    let first = env.queue.read_events_page(QUEUE, "0", 10).await.unwrap();
    let e1 = &first.events[0];
    assert_eq!((&e1.kind, &e1.job_id), (&EventKind::Enqueued, &j1));
    let stuck = env
        .queue
        .read_events(QUEUE, &e1.stream_id, 10)
        .await
        .unwrap();
    assert!(stuck.is_empty(), "10 foreign entries decode to nothing");

    let (mut after, mut seen, mut pages) = (e1.stream_id.clone(), Vec::new(), 0);
    loop {
        let page = env.queue.read_events_page(QUEUE, &after, 10).await.unwrap();
        seen.extend(page.events);
        pages += 1;
        assert!(pages < 10, "paging ends");
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    let ids: Vec<&JobId> = seen.iter().map(|e| &e.job_id).collect();
    assert_eq!(ids, [&j2], "every event after j1, past the foreign entries");
}
