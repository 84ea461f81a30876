//! Test helpers shared by the unit tests of `dead replay` (commands/dead.rs)
//! and of the dashboard's bulk actions (dashboard/bulk.rs): a dead letter as
//! a fail leaves it, and someone else's replay of one that dies again.

use queue_core::admin::{Admin, ReplayOutcome};
use queue_core::QueueKeys;

/// A dead letter of `queue` as a fail leaves it: listed, its hash `dead` at
/// `dead_at`, of type `job_type`, dead of `reason`.
pub(crate) async fn dead_letter(
    admin: &Admin,
    queue: &str,
    id: &str,
    dead_at: &str,
    (job_type, reason): (&str, &str),
) {
    let k = QueueKeys::new(queue);
    let () = redis::pipe()
        .cmd("HSET")
        .arg(k.job(id))
        .arg(&["state", "dead", "type", job_type, "dead_reason", reason])
        .arg("dead_at")
        .arg(dead_at)
        .ignore()
        .cmd("LPUSH")
        .arg(&k.dead)
        .arg(id)
        .ignore()
        .query_async(&mut admin.queue().connection())
        .await
        .unwrap();
}

/// Someone else's replay of dead letter `id`: it is replayed, runs (taken
/// out of main) and is dead-lettered again at `dead_at`.
pub(crate) async fn replayed_and_dead_again(
    admin: &Admin,
    queue: &str,
    id: &str,
    dead_at: &str,
    kind: (&str, &str),
) {
    let replayed = admin.replay_dead(queue, id, false).await.unwrap();
    assert_eq!(replayed, ReplayOutcome::Replayed);
    let () = redis::cmd("LREM")
        .arg(QueueKeys::new(queue).main)
        .arg(0)
        .arg(id)
        .query_async(&mut admin.queue().connection())
        .await
        .unwrap();
    dead_letter(admin, queue, id, dead_at, kind).await;
}
