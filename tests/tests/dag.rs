//! The typed DAG builder (issue #14, docs/WORKFLOWS.md "DAGs") against a
//! real redis-server: a diamond runs every step once, after its
//! dependencies, each reading their typed results; repeating `enqueue`
//! creates nothing twice; the per-dependency policies; a refused DAG writes
//! nothing; a DAG whose producer died before the seal expires (open TTL) and
//! leaves the batch index; and worker processes SIGKILLed mid-DAG still run
//! every step exactly once; a DAG whose root is on another queue runs
//! through the relay.

use std::time::Duration;

use queue_core::{
    ChildPolicy, Dag, DagError, EnqueueOutcome, JobSpec, QueueKeys, Worker, DEFAULT_OPEN_TTL,
};
use queue_tests::dag_jobs::{dag_email_step, dag_step, DagStep};
use queue_tests::workflow_jobs::{wf_member, WfMember, EMAILS, WF_QUEUE};
use queue_tests::{fast_config, wait_until, TestEnv, WorkerHandle, WorkerProcess, BOUND};
use redis::AsyncCommands;
use std::collections::HashMap;

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_test-worker");

fn step(env: &TestEnv) -> JobSpec {
    step_with(env, |_| {})
}

fn step_with(env: &TestEnv, shape: impl FnOnce(&mut DagStep)) -> JobSpec {
    let mut s = DagStep {
        ledger: env.ledger_url.clone(),
        ..DagStep::default()
    };
    shape(&mut s);
    JobSpec::new::<dag_step::Job>(&s).unwrap()
}

/// a -> b, a -> c, (b, c) -> d.
fn diamond(env: &TestEnv, id: &str) -> Dag {
    Dag::new(id)
        .step("a", step(env))
        .step("b", step(env))
        .after(["a"])
        .step("c", step(env))
        .after(["a"])
        .step("d", step(env))
        .after(["b", "c"])
}

async fn spawn_worker(env: &TestEnv) -> WorkerHandle {
    let builder = Worker::builder(&env.url)
        .register(dag_step::handler())
        .config(fast_config());
    WorkerHandle::start(builder).await
}

async fn ledger(env: &TestEnv, key: &str) -> HashMap<String, String> {
    env.ledger_hash(key).await
}

async fn wait_runs(env: &TestEnv, ids: &[String]) -> HashMap<String, String> {
    wait_until(BOUND, &format!("{} step runs", ids.len()), || async {
        let runs = ledger(env, "ledger:dag:runs").await;
        ids.iter().all(|id| runs.contains_key(id))
    })
    .await;
    ledger(env, "ledger:dag:runs").await
}

async fn enqueued(env: &TestEnv) -> u64 {
    let n: Option<u64> = env
        .conn()
        .await
        .hget(QueueKeys::new(WF_QUEUE).stats, "enqueued")
        .await
        .unwrap();
    n.unwrap_or(0)
}

fn ids(dag: &str, steps: &[&str]) -> Vec<String> {
    steps.iter().map(|s| Dag::step_id(dag, s)).collect()
}

#[tokio::test]
async fn a_diamond_runs_each_step_once_after_its_dependencies() {
    let env = TestEnv::start().await;
    let created = diamond(&env, "o1").enqueue(&env.queue).await.unwrap();
    assert_eq!(created.roots.len(), 1);
    assert_eq!(created.steps[0], ("a".to_string(), "o1:a".to_string()));
    let worker = spawn_worker(&env).await;
    let runs = wait_runs(&env, &ids("o1", &["a", "b", "c", "d"])).await;
    worker.stop().await;
    assert!(runs.values().all(|n| n == "1"), "{runs:?}");
    let inputs = ledger(&env, "ledger:dag:inputs").await;
    assert_eq!(inputs["o1:a"], "");
    assert_eq!(inputs["o1:b"], "a:ok");
    assert_eq!(inputs["o1:c"], "a:ok");
    // d was created once, when both b and c had finished with results.
    assert_eq!(inputs["o1:d"], "b:ok,c:ok");
    let lineage = ledger(&env, "ledger:dag:lineage").await;
    assert_eq!(lineage["o1:d"], "a,b,c,d");
    // The root feeds two steps (its `batch` field holds two keys): its
    // `batch_summary` reads the first (before: `None`); the others read the
    // batch that spawned them.
    let summary = ledger(&env, "ledger:dag:summary").await;
    assert!(
        matches!(summary["o1:a"].as_str(), "o1:b" | "o1:c"),
        "{summary:?}"
    );
    assert_eq!(
        (summary["o1:b"].as_str(), summary["o1:d"].as_str()),
        ("o1:b", "o1:d")
    );
    assert_eq!(enqueued(&env).await, 4);
    let d = env.queue.batch(WF_QUEUE, "o1:d").await.unwrap().unwrap();
    assert_eq!((d.state.as_str(), d.total, d.succeeded), ("fired", 2, 2));
}

#[tokio::test]
async fn enqueuing_the_same_dag_again_creates_nothing_twice() {
    let env = TestEnv::start().await;
    diamond(&env, "o2").enqueue(&env.queue).await.unwrap();
    // A producer that retried (it did not know the first call succeeded).
    let again = diamond(&env, "o2").enqueue(&env.queue).await.unwrap();
    assert!(matches!(
        again.roots[0].outcome,
        EnqueueOutcome::Duplicate { .. }
    ));
    let worker = spawn_worker(&env).await;
    wait_runs(&env, &ids("o2", &["a", "b", "c", "d"])).await;
    // And once more after it all ran.
    let late = diamond(&env, "o2").enqueue(&env.queue).await.unwrap();
    assert_eq!(late.roots[0].outcome, EnqueueOutcome::AlreadyCompleted);
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.stop().await;
    let runs = ledger(&env, "ledger:dag:runs").await;
    assert!(runs.values().all(|n| n == "1"), "{runs:?}");
    assert_eq!(enqueued(&env).await, 4);
}

#[tokio::test]
async fn a_failed_dependency_acts_by_its_policy() {
    let env = TestEnv::start().await;
    // b fails: d (FailParent on b) is dead-lettered, and so is e after d;
    // f (Continue on b) runs and sees the error; g (Ignore) runs without it.
    Dag::new("p")
        .step("a", step(&env))
        .step("b", step_with(&env, |s| s.fail = true))
        .after(["a"])
        .step("d", step(&env))
        .after(["b", "a"])
        .step("e", step(&env))
        .after(["d"])
        .step("f", step(&env))
        .after(["a"])
        .after_with(ChildPolicy::Continue, ["b"])
        .step("g", step(&env))
        .after_with(ChildPolicy::Ignore, ["b"])
        .enqueue(&env.queue)
        .await
        .unwrap();
    let worker = spawn_worker(&env).await;
    wait_runs(&env, &ids("p", &["a", "f", "g"])).await;
    wait_until(BOUND, "d and e dead-lettered", || async {
        env.stats(WF_QUEUE).await.dead >= 3
    })
    .await;
    worker.stop().await;
    let inputs = ledger(&env, "ledger:dag:inputs").await;
    assert_eq!(inputs["p:f"], "a:ok,b:err");
    assert_eq!(inputs["p:g"], "");
    let runs = ledger(&env, "ledger:dag:runs").await;
    assert!(
        !runs.contains_key("p:d") && !runs.contains_key("p:e"),
        "{runs:?}"
    );
    let dead = env.list(&QueueKeys::new(WF_QUEUE).dead).await;
    for id in ["p:b", "p:d", "p:e"] {
        assert!(dead.iter().any(|d| d == id), "{id} not dead: {dead:?}");
    }
    let e = env.queue.batch(WF_QUEUE, "p:e").await.unwrap().unwrap();
    assert_eq!((e.state.as_str(), e.dead), ("fired", 1));
}

#[tokio::test]
async fn a_refused_dag_writes_nothing_and_names_the_problem() {
    let env = TestEnv::start().await;
    let cyclic = diamond(&env, "c1").step("e", step(&env)).after(["d", "e"]);
    let e = cyclic.enqueue(&env.queue).await.unwrap_err();
    assert!(
        matches!(&e, DagError::Cycle { dag, cycle } if dag == "c1" && cycle == &["e", "e"]),
        "{e}"
    );
    let e = Dag::new("c2")
        .step("a", step(&env))
        .step("b", step(&env))
        .after(["a", "zz"])
        .enqueue(&env.queue)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "dag `c2`: step `b` depends on unknown step `zz`"
    );
    let e = Dag::new("c3").enqueue(&env.queue).await.unwrap_err();
    assert!(matches!(e, DagError::Empty { .. }), "{e}");
    let keys: Vec<String> = env.conn().await.keys("q:*").await.unwrap();
    assert!(keys.is_empty(), "a refused DAG wrote {keys:?}");
}

/// The producer dies between opening the batches and sealing them (here:
/// the root's enqueue fails on a corrupt main list): the open batches expire
/// after the open TTL, and a later open sweeps them out of the index.
#[tokio::test]
async fn a_batch_never_sealed_expires_and_leaves_the_index() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new(WF_QUEUE);
    let _: () = env.conn().await.set(&keys.main, "corrupt").await.unwrap();
    let e = diamond(&env, "x1")
        .open_ttl(Duration::from_millis(400))
        .enqueue(&env.queue)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, DagError::Queue { step, .. } if step == "a"),
        "{e}"
    );
    let open = env.queue.batch(WF_QUEUE, "x1:d").await.unwrap().unwrap();
    assert_eq!(open.state, "open");
    let index: Vec<String> = env
        .conn()
        .await
        .zrange(keys.batches(), 0, -1)
        .await
        .unwrap();
    assert_eq!(index.len(), 3, "{index:?}");
    let _: () = env.conn().await.del(&keys.main).await.unwrap();
    wait_until(BOUND, "the open batches expired", || async {
        for s in ["b", "c", "d"] {
            let id = Dag::step_id("x1", s);
            if env.queue.batch(WF_QUEUE, &id).await.unwrap().is_some() {
                return false;
            }
        }
        true
    })
    .await;
    // The next DAG's opens sweep the expired entries (and their sets) out.
    diamond(&env, "x2").enqueue(&env.queue).await.unwrap();
    let index: Vec<String> = env
        .conn()
        .await
        .zrange(keys.batches(), 0, -1)
        .await
        .unwrap();
    assert!(index.iter().all(|id| id.starts_with("x2:")), "{index:?}");
    let left: bool = env
        .conn()
        .await
        .exists(format!("{}:members", keys.batch("x1:d")))
        .await
        .unwrap();
    assert!(!left, "the expired batch's members set is left");
    // A sealed batch keeps no TTL: it waits for its members.
    let ttl: i64 = env.conn().await.pttl(keys.batch("x2:d")).await.unwrap();
    assert_eq!(ttl, -1);
}

/// The producer died before the seal and retries after the open TTL (as
/// docs/WORKFLOWS.md says it may): the batch is opened anew and its members
/// count again. Before, the expired batch's `:members` set outlived its
/// hash, the retry registered no id (`total` 0) and the seal fired the
/// batch at once, creating `d` before any dependency ran.
#[tokio::test]
async fn a_batch_reopened_after_its_open_ttl_waits_for_its_members() {
    let env = TestEnv::start().await;
    let keys = QueueKeys::new(WF_QUEUE);
    let fan_in = |ttl: Duration| {
        Dag::new("r1")
            .step("a", step(&env))
            .step("b", step(&env))
            .step("c", step(&env))
            .step("d", step(&env))
            .after(["a", "b", "c"])
            .open_ttl(ttl)
    };
    let _: () = env.conn().await.set(&keys.main, "corrupt").await.unwrap();
    fan_in(Duration::from_millis(300))
        .enqueue(&env.queue)
        .await
        .unwrap_err();
    let open = env.queue.batch(WF_QUEUE, "r1:d").await.unwrap().unwrap();
    assert_eq!((open.state.as_str(), open.total), ("open", 3));
    let _: () = env.conn().await.del(&keys.main).await.unwrap();
    wait_until(BOUND, "the open batch expired", || async {
        env.queue.batch(WF_QUEUE, "r1:d").await.unwrap().is_none()
    })
    .await;
    // The retry, with no worker running: nothing may fire yet.
    fan_in(DEFAULT_OPEN_TTL).enqueue(&env.queue).await.unwrap();
    let d = env.queue.batch(WF_QUEUE, "r1:d").await.unwrap().unwrap();
    assert_eq!((d.state.as_str(), d.total, d.finished()), ("sealed", 3, 0));
    let main = env.list(&keys.main).await;
    assert!(
        !main.contains(&"r1:d".to_string()),
        "d fired early: {main:?}"
    );
    // A reopen of the live batch keeps it as it is.
    fan_in(DEFAULT_OPEN_TTL).enqueue(&env.queue).await.unwrap();
    let d = env.queue.batch(WF_QUEUE, "r1:d").await.unwrap().unwrap();
    assert_eq!((d.state.as_str(), d.total), ("sealed", 3));
    let worker = spawn_worker(&env).await;
    let runs = wait_runs(&env, &ids("r1", &["a", "b", "c", "d"])).await;
    worker.stop().await;
    assert!(runs.values().all(|n| n == "1"), "{runs:?}");
    assert_eq!(
        ledger(&env, "ledger:dag:inputs").await["r1:d"],
        "a:ok,b:ok,c:ok"
    );
}

/// A step that several steps run after is a member of each of their
/// batches (its `batch` field holds their keys, one per line): its
/// `ctx.batch_add` is refused for good, naming why, and the step is
/// dead-lettered at its first attempt. Before, the two-line field was taken
/// for one batch key, `batch_add` answered "no such batch" as a retryable
/// error, and the step was retried until its attempts ran out.
#[tokio::test]
async fn batch_add_from_a_step_feeding_two_steps_is_refused_for_good() {
    let env = TestEnv::start().await;
    let adder = WfMember {
        ledger: env.ledger_url.clone(),
        add_more: true,
        ..WfMember::default()
    };
    Dag::new("ba")
        .step("a", JobSpec::new::<wf_member::Job>(&adder).unwrap())
        .step("b", step(&env))
        .after(["a"])
        .step("c", step(&env))
        .after(["a"])
        .enqueue(&env.queue)
        .await
        .unwrap();
    let builder = Worker::builder(&env.url)
        .register(dag_step::handler())
        .register(wf_member::handler())
        .config(fast_config());
    let worker = WorkerHandle::start(builder).await;
    let keys = QueueKeys::new(WF_QUEUE);
    wait_until(BOUND, "step a dead-lettered", || async {
        env.list(&keys.dead).await.contains(&"ba:a".to_string())
    })
    .await;
    worker.stop().await;
    let reason = env
        .ledger_field(&keys.job("ba:a"), "dead_reason")
        .await
        .unwrap();
    assert!(reason.contains("member of 2 batches"), "{reason}");
    let attempts = env.ledger_field(&keys.job("ba:a"), "attempts").await;
    assert_eq!(attempts.as_deref(), Some("1"));
}

/// 20 DAGs (a diamond plus `e` after `d` and `a`: `a` feeds three batches)
/// on three `test-worker` processes, two SIGKILLed mid-DAG: every step is
/// created once, and each runs after its dependencies with their results.
#[tokio::test]
async fn killed_workers_run_every_step_exactly_once() {
    let env = TestEnv::start().await;
    const DAGS: usize = 20;
    let slow = |env: &TestEnv| step_with(env, |s| s.sleep_ms = 40);
    let mut all = Vec::new();
    for n in 0..DAGS {
        let id = format!("k{n}");
        Dag::new(id.as_str())
            .step("a", slow(&env))
            .step("b", slow(&env))
            .after(["a"])
            .step("c", slow(&env))
            .after(["a"])
            .step("d", slow(&env))
            .after(["b", "c"])
            .step("e", slow(&env))
            .after(["d", "a"])
            .enqueue(&env.queue)
            .await
            .unwrap();
        all.extend(ids(&id, &["a", "b", "c", "d", "e"]));
    }
    let _watchdog = env.spawn_watchdog(WF_QUEUE).await;
    let mut procs: Vec<WorkerProcess> = (0..3)
        .map(|_| {
            WorkerProcess::start_with_env(
                WORKER_BIN,
                &env.url,
                4,
                1000,
                2000,
                None,
                &[(queue_tests::workflow_jobs::ENV, "1")],
            )
        })
        .collect();
    for victim in procs.iter_mut().take(2) {
        let before = ledger(&env, "ledger:dag:runs").await.len();
        wait_until(BOUND, "progress before the kill", || async {
            ledger(&env, "ledger:dag:runs").await.len() > before + 15
        })
        .await;
        victim.kill();
    }
    wait_runs(&env, &all).await;
    drop(procs);
    assert_eq!(
        enqueued(&env).await,
        (DAGS * 5) as u64,
        "each step created once"
    );
    let inputs = ledger(&env, "ledger:dag:inputs").await;
    let lineage = ledger(&env, "ledger:dag:lineage").await;
    for n in 0..DAGS {
        let id = |s: &str| Dag::step_id(&format!("k{n}"), s);
        assert_eq!(inputs[&id("d")], "b:ok,c:ok");
        assert_eq!(inputs[&id("e")], "a:ok,d:ok");
        assert_eq!(lineage[&id("e")], "a,b,c,d,e");
        for s in ["b", "c", "d", "e"] {
            let b = env.queue.batch(WF_QUEUE, &id(s)).await.unwrap().unwrap();
            assert_eq!(b.state, "fired", "{}", id(s));
            assert_eq!(
                b.succeeded,
                b.total,
                "{}: each dependency counted once",
                id(s)
            );
        }
    }
}

/// A DAG across queues: the root `a` runs on `emails` (another hash tag, so
/// another Cluster slot), `b` and `c` on the DAG's queue after it, `d` after
/// both. `a`'s ack cannot touch `b`'s and `c`'s batches: it writes one
/// notice per batch on `emails`, the relay applies them (docs/WORKFLOWS.md
/// "Relay"), and every step runs once.
#[tokio::test]
async fn a_dag_across_queues_runs_each_step_once() {
    let env = TestEnv::start().await;
    let root = DagStep {
        ledger: env.ledger_url.clone(),
        ..DagStep::default()
    };
    let root = JobSpec::new::<dag_email_step::Job>(&root).unwrap();
    assert_eq!(root.queue(), EMAILS);
    Dag::new("xq")
        .step("a", root)
        .step("b", step(&env))
        .after(["a"])
        .step("c", step(&env))
        .after(["a"])
        .step("d", step(&env))
        .after(["b", "c"])
        .enqueue(&env.queue)
        .await
        .unwrap();
    let builder = Worker::builder(&env.url)
        .register(dag_step::handler())
        .register(dag_email_step::handler())
        .config(fast_config());
    let worker = WorkerHandle::start(builder).await;
    let runs = wait_runs(&env, &ids("xq", &["a", "b", "c", "d"])).await;
    worker.stop().await;
    assert!(runs.values().all(|n| n == "1"), "{runs:?}");
    assert_eq!(enqueued(&env).await, 3, "b, c and d spawned once each");
    for step in ["b", "c"] {
        let b = env
            .queue
            .batch(WF_QUEUE, &Dag::step_id("xq", step))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((b.state.as_str(), b.total, b.succeeded), ("fired", 1, 1));
    }
    let relay = env.list(&QueueKeys::new(EMAILS).relay()).await;
    assert!(relay.is_empty(), "notices left on emails: {relay:?}");
    let lineage = ledger(&env, "ledger:dag:lineage").await;
    assert_eq!(
        lineage["xq:d"], "a,b,c,d",
        "a's result reached d through b and c"
    );
    assert_eq!(env.stats(EMAILS).await.counter("relayed"), 2);
}

/// A DAG of more than 256 steps stores each step's own line on its batch
/// (and the number of steps), not the whole shape: the whole shape on every
/// batch grew with the square of the DAG's size (about 90 KB a batch and
/// 40 MB for 2,000 steps, kept 7 days after each batch fires). A small DAG
/// keeps its whole shape on every batch, as operators' views show it.
#[tokio::test]
async fn a_large_dag_stores_each_steps_own_line_not_the_whole_shape() {
    let env = TestEnv::start().await;
    let admin = queue_core::admin::Admin::new(env.queue.clone());
    let keys = QueueKeys::new(WF_QUEUE);

    diamond(&env, "small").enqueue(&env.queue).await.unwrap();
    let d = admin
        .batch_detail(WF_QUEUE, &Dag::step_id("small", "d"))
        .await
        .unwrap()
        .expect("the batch of step d");
    assert_eq!((d.dag_steps.len(), d.dag_steps_total), (4, 4));

    let mut big = Dag::new("big");
    for i in 0..300 {
        big = big
            .step(format!("fetch{i}"), step(&env))
            .step(format!("load{i}"), step(&env))
            .after([format!("fetch{i}")]);
    }
    big.enqueue(&env.queue).await.unwrap();
    let mut conn = env.conn().await;
    let mut stored = 0usize;
    for i in 0..300 {
        let key = keys.batch(&Dag::step_id("big", &format!("load{i}")));
        let len: usize = redis::cmd("HSTRLEN")
            .arg(&key)
            .arg("m_steps")
            .query_async(&mut conn)
            .await
            .unwrap();
        stored += len;
    }
    // One line of ~20 bytes a batch; the whole shape was ~11 KB on each.
    assert!(
        stored < 300 * 64,
        "m_steps holds {stored} bytes over 300 batches"
    );
    let load = admin
        .batch_detail(WF_QUEUE, &Dag::step_id("big", "load7"))
        .await
        .unwrap()
        .expect("the batch of step load7");
    assert_eq!(load.dag_steps_total, 600);
    assert_eq!(load.dag_steps.len(), 1);
    assert_eq!(load.dag_steps[0].name, "load7");
    assert_eq!(load.dag_steps[0].after, vec!["fetch7".to_string()]);
}
