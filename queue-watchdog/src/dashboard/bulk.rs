//! Bulk replay / purge of a filtered set of dead letters, in two steps:
//!
//! 1. `POST /api/queues/{q}/bulk-dead/preview` with `{"type", "contains"}`
//!    counts the matching dead letters (the list read in chunks, see
//!    `dead_scan.rs`) and the page shows that count for confirmation;
//! 2. `POST /api/queues/{q}/bulk-dead/replay` (or `/purge`) with the same
//!    filter, `"expect": <count>` and `"selection": <digest>` from the
//!    preview selects again and acts only when the selection is still the
//!    one confirmed: the same dead-letterings, not only as many (409 with the
//!    new count otherwise), then replays (`replay.lua`) or purges
//!    (`purge.lua`) each job, only the dead-lettering that was selected (a
//!    job replayed and dead-lettered again since is skipped): one script per
//!    job, so a big set never blocks Redis. The work runs in a
//!    task of its own: a client that goes away (a proxy's timeout, a closed
//!    tab) does not stop it half-way, and the audit line is always written.
//!
//! A selection holds at most [`MAX_SELECTED`] dead letters (the newest
//! matching ones): a bigger set is acted on in rounds, each previewed.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use queue_core::admin::{DeadReasons, PurgeOutcome, ReplayOutcome};
use serde::Deserialize;
use serde_json::json;

use super::audit::Entry;
use super::auth::Who;
use super::dead_scan::{scan_with, DeadFilter, DeadRow, Scan};
use super::security::check_same_origin;
use super::Shared;

/// Ids listed in a preview.
const SAMPLE: usize = 5;

/// The most dead letters one preview selects (the newest matching ones): it
/// bounds the dashboard's memory and the time of one action.
pub const MAX_SELECTED: usize = 100_000;

#[derive(Deserialize)]
pub struct BulkRequest {
    #[serde(flatten)]
    filter: DeadFilter,
    /// The count the user confirmed (required by the action).
    #[serde(default)]
    expect: Option<u64>,
    /// The preview's `selection` digest (required by the action).
    #[serde(default)]
    selection: Option<String>,
}

fn error(status: StatusCode, msg: impl std::fmt::Display) -> Response {
    (status, Json(json!({"error": msg.to_string()}))).into_response()
}

/// The dead letters `filter` selects: the newest [`MAX_SELECTED`] matching,
/// each dead-lettering once (a chunked scan that ran while the list moved
/// can read an entry twice). Entries whose job key cannot be read (corrupt
/// data, `DeadRow::unreadable`) are left out, since a replay or purge of one
/// would be refused. Each row keeps only its id and `dead_at` (what the
/// action and the digest use; the preview shows ids): a selection holding
/// every reason in full (error texts can be large) held gigabytes per
/// request. No reason is even sent by Redis (`DeadReasons::Omitted`: the
/// filter reads them there): every chunk sent each whole, up to 4 MB a
/// chunk, to be dropped here.
async fn select(state: &Shared, queue: &str, filter: &DeadFilter) -> Result<Scan, Response> {
    let omitted = (filter, DeadReasons::Omitted);
    let mut found = scan_with(state, queue, omitted, 0, MAX_SELECTED, u64::MAX, selected)
        .await
        .map_err(|e| error(StatusCode::BAD_GATEWAY, e))?;
    let mut seen = std::collections::HashSet::new();
    found
        .rows
        .retain(|r| r.unreadable.is_none() && seen.insert((r.id.clone(), r.dead_at.clone())));
    Ok(found)
}

/// A row as a selection keeps it: id, `dead_at`, and whether it is
/// unreadable (its reason dropped: the selection leaves such rows out).
fn selected(row: DeadRow) -> DeadRow {
    DeadRow {
        id: row.id,
        dead_at: row.dead_at,
        unreadable: row.unreadable.map(|_| String::new()),
        job_type: None,
        reason: None,
        attempts: None,
    }
}

/// A digest of the selected dead-letterings (id and `dead_at`, in list
/// order): the action acts only on the set the preview showed, not on
/// another set of the same size.
fn digest(found: &Scan) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for r in &found.rows {
        (&r.id, &r.dead_at).hash(&mut h);
    }
    found.rows.len().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Step 1: how many dead letters the filter selects.
pub async fn preview(
    State(state): State<Shared>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    Json(req): Json<BulkRequest>,
) -> Response {
    if let Err(why) = check_same_origin(&headers) {
        return error(StatusCode::FORBIDDEN, why);
    }
    let filter = req.filter.normalized();
    let found = match select(&state, &queue, &filter).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let sample: Vec<&str> = found
        .rows
        .iter()
        .take(SAMPLE)
        .map(|r| r.id.as_str())
        .collect();
    Json(json!({
        "queue": queue,
        "filter": filter.describe(),
        "count": found.rows.len(),
        "total": found.total,
        "sample": sample,
        "selection": digest(&found),
        // More may match beyond the newest MAX_SELECTED (act, then preview
        // again): the scan stopped before the list's end. The count of `rows`
        // cannot tell, since skipped and repeated entries are out of it.
        "more": found.next.is_some(),
    }))
    .into_response()
}

/// Step 2: replay or purge the confirmed set.
pub async fn act(
    State(state): State<Shared>,
    Path((queue, action)): Path<(String, String)>,
    Extension(who): Extension<Who>,
    headers: HeaderMap,
    Json(req): Json<BulkRequest>,
) -> Response {
    if let Err(why) = check_same_origin(&headers) {
        return error(StatusCode::FORBIDDEN, why);
    }
    if action != "replay" && action != "purge" {
        return error(
            StatusCode::NOT_FOUND,
            format!("unknown bulk action {action:?}"),
        );
    }
    let (Some(expect), Some(selection)) = (req.expect, req.selection) else {
        return error(
            StatusCode::BAD_REQUEST,
            "\"expect\" and \"selection\" (the confirmed count and selection from the preview) are required",
        );
    };
    let filter = req.filter.normalized();
    let found = match select(&state, &queue, &filter).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let count = found.rows.len() as u64;
    if count != expect || digest(&found) != selection {
        return (
            StatusCode::CONFLICT,
            Json(json!({"count": count, "error": format!(
                "the selection changed: {count} dead letters match now (confirmed: {expect}), \
                 not all of them the ones confirmed; confirm again"
            )})),
        )
            .into_response();
    }
    // In a task of its own: dropping this request (the client went away)
    // must not stop the action half-way nor lose its audit line.
    let work = tokio::spawn(run(state, queue, action, who, filter, found));
    match work.await {
        Ok(response) => response,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// Replays or purges each selected dead letter, then writes the audit line.
/// Each acts only on the dead-lettering that was selected (its `dead_at`):
/// a job replayed and dead-lettered again since the selection (one the
/// confirmation never showed), or no longer dead, is skipped.
async fn run(
    state: Shared,
    queue: String,
    action: String,
    who: Who,
    filter: DeadFilter,
    found: Scan,
) -> Response {
    let (mut done, mut skipped) = (0u64, 0u64);
    let mut failure = None;
    for row in &found.rows {
        let changed = if action == "replay" {
            state
                .admin
                .replay_dead_if_unchanged(&queue, row.id.as_str(), false, row.dead_at.as_deref())
                .await
                .map(|o| o == ReplayOutcome::Replayed)
        } else {
            state
                .admin
                .purge_dead(&queue, row.id.as_str(), row.dead_at.as_deref())
                .await
                .map(|o| o == PurgeOutcome::Purged)
        };
        match changed {
            Ok(true) => done += 1,
            Ok(false) => skipped += 1,
            Err(e) => {
                failure = Some(e.to_string());
                break;
            }
        }
    }
    state.audit.record(Entry {
        who: &who.0,
        action: if action == "replay" {
            "bulk_replay"
        } else {
            "bulk_purge"
        },
        queue: &queue,
        what: &filter.describe(),
        count: done,
    });
    let body = json!({"action": action, "done": done, "skipped": skipped,
        "filter": filter.describe(), "error": failure});
    let status = if failure.is_some() {
        StatusCode::BAD_GATEWAY
    } else {
        StatusCode::OK
    };
    (status, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use queue_core::admin::Admin;
    use queue_core::QueueKeys;
    use queue_testkit::RedisServer;

    use super::*;
    use crate::dashboard::AppState;

    /// A bulk selection (up to 100,000 rows, read again on every preview
    /// and action) keeps each row's id and `dead_at`, not its reason or
    /// type. Before, every row kept its full reason: 100k error texts of
    /// 20 KB were 2 GB per request.
    #[tokio::test]
    async fn a_selection_keeps_ids_and_dead_at_not_reasons() {
        let server = RedisServer::start().unwrap();
        let admin = Admin::connect(&server.url()).await.unwrap();
        let k = QueueKeys::new("q");
        let trace = format!("Upstream TIMEOUT {}", "at frame 7\n".repeat(2_000));
        let mut pipe = redis::pipe();
        for i in 0..20 {
            let (id, reason) = if i % 4 == 0 {
                (format!("other-{i}"), "refused".to_string())
            } else {
                (format!("slow-{i}"), trace.clone())
            };
            pipe.cmd("HSET")
                .arg(k.job(&id))
                .arg(&["state", "dead", "type", "render", "dead_at"])
                .arg(i.to_string())
                .arg("dead_reason")
                .arg(reason)
                .ignore()
                .cmd("RPUSH")
                .arg(&k.dead)
                .arg(&id)
                .ignore();
        }
        let () = pipe
            .query_async(&mut admin.queue().connection())
            .await
            .unwrap();
        let state = AppState::for_tests(admin);
        let filter = DeadFilter {
            job_type: None,
            contains: Some("timeout".into()),
        }
        .normalized();
        let Ok(found) = select(&state, "q", &filter).await else {
            panic!("the selection failed");
        };
        assert_eq!(found.rows.len(), 15);
        for r in &found.rows {
            assert!(r.id.starts_with("slow-"), "{}", r.id);
            assert!(r.dead_at.is_some(), "{} kept its dead_at", r.id);
            assert_eq!(
                (r.reason.as_ref().map(String::len), &r.job_type),
                (None, &None),
                "{} kept its reason or type",
                r.id
            );
        }
    }

    const RENDERED: (&str, &str) = ("render", "Upstream TIMEOUT");

    async fn dead_letter(admin: &Admin, id: &str, dead_at: &str) {
        crate::test_dead::dead_letter(admin, "q", id, dead_at, RENDERED).await;
    }

    /// A bulk replay is confirmed for `x` and `y` (dead at 100); before it
    /// runs, someone replays `x`, which runs and is dead-lettered again (dead
    /// at 200). The bulk replay replays `y` and skips `x`: its new
    /// dead-lettering was never shown for confirmation, so it stays dead, as
    /// a bulk purge leaves it. Before, the replay took no `dead_at`: `x` was
    /// replayed too.
    #[tokio::test]
    async fn a_bulk_replay_skips_a_job_dead_lettered_again_since_the_confirmation() {
        let server = RedisServer::start().unwrap();
        let admin = Admin::connect(&server.url()).await.unwrap();
        let k = QueueKeys::new("q");
        for id in ["x", "y"] {
            dead_letter(&admin, id, "100").await;
        }
        let state = AppState::for_tests(admin.clone());
        let filter = DeadFilter {
            job_type: None,
            contains: Some("timeout".into()),
        }
        .normalized();
        let Ok(confirmed) = select(&state, "q", &filter).await else {
            panic!("the selection failed");
        };
        assert_eq!(confirmed.rows.len(), 2);

        // Someone else's replay of `x`; it runs and dies again.
        crate::test_dead::replayed_and_dead_again(&admin, "q", "x", "200", RENDERED).await;
        let mut conn = admin.queue().connection();

        let who = Who("test@127.0.0.1".into());
        let response = run(state, "q".into(), "replay".into(), who, filter, confirmed).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((&body["done"], &body["skipped"]), (&json!(1), &json!(1)));
        let dead: Vec<String> = redis::cmd("LRANGE")
            .arg(&k.dead)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let main: Vec<String> = redis::cmd("LRANGE")
            .arg(&k.main)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!((dead, main), (vec!["x".to_string()], vec!["y".to_string()]));
    }
}
