//! Who did what (issue #11 item 12): a worker's name is in the job hash of
//! the delivery it runs and `queue-watchdog jobs show` prints it; a job's
//! timeout set on the worker at run time replaces the one of `#[job(timeout)]`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use queue_core::QueueKeys;
use queue_tests::{fast_config, wait_until, TestEnv, WorkerHandle, BOUND};
use redis::AsyncCommands;

const QUEUE: &str = "tasks";

/// The `queue-watchdog` binary of this workspace, (re)built first so that it
/// has the current code (a no-op when it is fresh).
fn watchdog_bin() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "queue-watchdog",
            "--bin",
            "queue-watchdog",
        ])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building queue-watchdog failed");
    // The test runs as target/<profile>/deps/identity-<hash>.
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile dir");
    dir.join(format!("queue-watchdog{}", std::env::consts::EXE_SUFFIX))
}

/// `<bin> --redis <url> jobs show <id> --queue tasks`: its stdout. Run on
/// the test's (single) runtime thread, so the worker is still while it runs.
fn jobs_show(bin: &PathBuf, url: &str, id: &str) -> String {
    let out = Command::new(bin)
        .args(["--redis", url, "jobs", "show", id, "--queue", QUEUE])
        .output()
        .expect("queue-watchdog runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "jobs show failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The job's `worker` field, if any.
async fn worker_field(env: &TestEnv, id: &str) -> Option<String> {
    let mut c = env.conn().await;
    c.hget(QueueKeys::new(QUEUE).job(id), "worker")
        .await
        .expect("HGET")
}

#[tokio::test]
async fn a_running_job_names_its_worker_in_its_hash_and_in_jobs_show() {
    let bin = watchdog_bin();
    let env = TestEnv::start().await;
    // Long enough to be seen running, short enough to finish the test.
    let id = env
        .enqueue(queue_tests::Task {
            sleep_ms: 3_000,
            ..env.task(0)
        })
        .await;
    let builder = env.worker(QUEUE, fast_config()).name("identity-test-7");
    let worker = WorkerHandle::start(builder).await;

    wait_until(BOUND, "the running job's hash names its worker", || async {
        worker_field(&env, id.as_str()).await.as_deref() == Some("identity-test-7")
    })
    .await;
    let shown = jobs_show(&bin, &env.url, id.as_str());
    assert!(
        shown.lines().any(|l| l == "  worker    identity-test-7"),
        "jobs show does not name the worker:\n{shown}"
    );
    assert!(shown.contains("  state     active"), "{shown}");

    env.wait_completed(QUEUE, 1).await;
    worker.stop().await;
}

#[tokio::test]
async fn a_worker_without_a_name_is_host_and_pid() {
    let env = TestEnv::start().await;
    let me = queue_core::WorkerIdentity::current();
    assert_eq!(me.name, format!("{}:{}", me.host, std::process::id()));
    let worker = env.worker(QUEUE, fast_config()).build().await.unwrap();
    assert_eq!(worker.identity(), &me);
}

#[tokio::test]
async fn a_timeout_set_on_the_worker_replaces_the_macro_timeout() {
    let env = TestEnv::start().await;
    // `task` has `#[job(timeout = "60s")]`: a 4 s first attempt would finish.
    let id = env
        .enqueue(queue_tests::Task {
            sleep_ms: 4_000,
            sleep_attempts: 1,
            ..env.task(0)
        })
        .await;
    let builder = env
        .worker(QUEUE, fast_config())
        .timeout_for("task", Duration::from_millis(300));
    let worker = WorkerHandle::start(builder).await;
    env.wait_completed(QUEUE, 1).await;
    worker.stop().await;

    // The first attempt timed out; the second (no sleep) succeeded.
    assert_eq!(env.completion_attempts(QUEUE, id.clone()).await, 2);
    let ledger = env.ledger().await;
    assert_eq!(ledger.started.get(id.as_str()), Some(&2));
    assert_eq!(ledger.effects.get(id.as_str()), Some(&1));
}

#[tokio::test]
async fn a_timeout_for_an_unregistered_type_is_refused() {
    let env = TestEnv::start().await;
    let err = env
        .worker(QUEUE, fast_config())
        .timeout_for("no_such_job", Duration::from_secs(1))
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no_such_job"), "{err}");
    let err = env
        .worker(QUEUE, fast_config())
        .timeout_for("task", Duration::ZERO)
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("more than zero"), "{err}");
}

/// A lease of "for ever" and a blocking wait of zero are refused when the
/// worker is built: the first panicked in every job's runner (the local
/// lease clock overflowed) and left the job leased, the second blocked a
/// BLMOVE for ever on the server, whose next job then sat in processing.
#[tokio::test]
async fn a_lease_for_ever_or_a_block_timeout_of_zero_is_refused() {
    let env = TestEnv::start().await;
    let refused = [
        (
            queue_core::WorkerConfig {
                lease: Duration::MAX,
                ..fast_config()
            },
            "at most 7 days",
        ),
        (
            queue_core::WorkerConfig {
                block_timeout: Duration::ZERO,
                ..fast_config()
            },
            "block_timeout",
        ),
    ];
    for (config, why) in refused {
        let err = env.worker(QUEUE, config).build().await.unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
    }
}
