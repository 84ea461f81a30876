//! Fair queuing between groups (tenants), docs/GROUPS.md: the job field that
//! names a job's group, per-group pause and resume ([`Queue::pause_group`],
//! [`Queue::resume_group`], script `scripts/group_pause.lua`) and the listing
//! of a queue's groups ([`Queue::groups`]). The routing itself lives in the
//! prelude's `-- ==== groups ====` functions, called by enqueue, fetch,
//! promote, replay, cancel and the checker's repair.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{QueueError, Result};
use crate::flow::PauseChange;
use crate::keys::QueueKeys;
use crate::queue::Queue;
use crate::scripts::group_pause::GroupPause;

/// The job-hash field holding a job's group (set by
/// [`EnqueueOptions::group`](crate::EnqueueOptions::group)).
pub(crate) const GROUP_FIELD: &str = "group";

/// One group of a queue, as [`Queue::groups`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupInfo {
    /// Group name.
    pub group: String,
    /// Jobs waiting in the group's list.
    pub waiting: u64,
    /// Redis time (ms) of the group's pause; `None` when it is not paused.
    pub paused_since_ms: Option<i64>,
}

impl Queue {
    /// Pauses group `group` of `queue`: no worker starts a job of that group
    /// until [`resume_group`](Self::resume_group); the other groups and the
    /// jobs without a group keep running, enqueues of the group are accepted
    /// and wait. A paused group with nothing waiting is still listed by
    /// [`groups`](Self::groups).
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), queue_core::QueueError> {
    /// # let server = queue_testkit::RedisServer::start().unwrap();
    /// use queue_core::{EnqueueOptions, Queue};
    /// let queue = Queue::connect(&server.url()).await?;
    /// let opts = EnqueueOptions::new().group("tenant-a");
    /// queue.enqueue_raw("emails", "send", 1, 3, opts, b"\x80").await?;
    /// let paused = queue.pause_group("emails", "tenant-a").await?;
    /// assert!(!paused.was_paused);
    /// let groups = queue.groups("emails").await?;
    /// assert_eq!((groups[0].group.as_str(), groups[0].waiting), ("tenant-a", 1));
    /// assert_eq!(groups[0].paused_since_ms, paused.paused_since_ms);
    /// assert!(queue.resume_group("emails", "tenant-a").await?.was_paused);
    /// # Ok(()) }
    /// ```
    pub async fn pause_group(&self, queue: &str, group: &str) -> Result<PauseChange> {
        self.group_pause(queue, group, true).await
    }

    /// Resumes group `group` of `queue`: puts it back in the ring while its
    /// list has jobs. A group that was not paused answers `was_paused: false`
    /// and is only put back in the ring if its jobs wait outside it (an older
    /// version's resume during a rolling deploy leaves that: docs/GROUPS.md).
    pub async fn resume_group(&self, queue: &str, group: &str) -> Result<PauseChange> {
        self.group_pause(queue, group, false).await
    }

    async fn group_pause(&self, queue: &str, group: &str, pause: bool) -> Result<PauseChange> {
        let keys = QueueKeys::new(queue);
        let change = GroupPause {
            keys: &keys,
            group,
            pause,
        }
        .run(&mut self.connection())
        .await?;
        tracing::info!(
            queue,
            group,
            pause,
            was_paused = change.was_paused,
            "group pause"
        );
        Ok(change)
    }

    /// The groups of `queue` that have waiting jobs or are paused: the ring's
    /// groups in the order workers serve them next, then the paused groups
    /// out of the ring (a fetch takes a paused group out, with or without
    /// jobs). Two reads, not one snapshot: a listing for operators.
    ///
    /// A group with jobs that is neither in the ring nor paused (left by an
    /// older version's resume) is not listed, nor counted by `stats().grouped`:
    /// finding it takes a `SCAN` of the group lists, too costly here.
    /// [`Admin::check`](crate::admin::Admin::check) reports it
    /// (`group_out_of_ring`) and its repair puts it back in the ring.
    pub async fn groups(&self, queue: &str) -> Result<Vec<GroupInfo>> {
        let keys = QueueKeys::new(queue);
        let mut conn = self.connection();
        let (ring, paused): (Vec<String>, BTreeMap<String, i64>) = redis::pipe()
            .lrange(keys.groups(), 0, -1)
            .hgetall(keys.groups_paused())
            .query_async(&mut conn)
            .await
            .map_err(|e| QueueError::redis(queue, None, e))?;
        let mut names: Vec<String> = ring.into_iter().filter(|g| !g.is_empty()).collect();
        for g in paused.keys() {
            if !names.contains(g) {
                names.push(g.clone());
            }
        }
        let mut pipe = redis::pipe();
        for g in &names {
            pipe.llen(keys.group(g));
        }
        let lens: Vec<u64> = if names.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(&mut conn)
                .await
                .map_err(|e| QueueError::redis(queue, None, e))?
        };
        Ok(names
            .into_iter()
            .zip(lens)
            .map(|(group, waiting)| GroupInfo {
                paused_since_ms: paused.get(&group).copied(),
                group,
                waiting,
            })
            .collect())
    }
}
