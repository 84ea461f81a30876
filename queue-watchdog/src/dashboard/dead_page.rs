//! `GET /queues/{q}/dead`: the dead-letter list in pages, for lists of any
//! length (100k entries: each page reads only its own slice, see
//! `dead_scan.rs`), with a type / error-text filter and the bulk replay or
//! purge panel (`bulk.rs` does the work, `assets/oncall.js` the confirmation).
//!
//! Without a filter, pages go by offset (`?offset=N&limit=100`: previous and
//! next are exact). With a filter, a page continues from the list position
//! where the previous one stopped (`from`), and `trail` keeps the positions
//! of the pages before it, so "previous" works too.

use std::time::Instant;

use axum::extract::{Path, Query, State};
use axum::response::Html;
use serde::Deserialize;

use super::dead_scan::{scan, DeadFilter, DeadRow};
use super::escape::{html, url_segment};
use super::handlers::AppError;
use super::{pages, Shared};
use crate::format::fmt_rel;

/// Entries a filtered page reads at most before it shows what it found.
const MAX_SCAN_PER_PAGE: u64 = 20_000;
/// Positions kept in `trail` (older ones are dropped: "previous" stops there).
const MAX_TRAIL: usize = 50;

#[derive(Deserialize, Default)]
pub struct DeadQuery {
    #[serde(default)]
    offset: u64,
    limit: Option<usize>,
    #[serde(default)]
    from: u64,
    #[serde(default)]
    trail: String,
    /// Job type, exact (not flattened: `serde_urlencoded` cannot flatten numbers).
    #[serde(default, rename = "type")]
    job_type: Option<String>,
    /// Error text, case-insensitive.
    #[serde(default)]
    contains: Option<String>,
}

/// The paged dead-letter page.
pub async fn page(
    State(state): State<Shared>,
    Path(queue): Path<String>,
    Query(q): Query<DeadQuery>,
) -> Result<Html<String>, AppError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 500);
    let filter = DeadFilter {
        job_type: q.job_type.clone(),
        contains: q.contains.clone(),
    }
    .normalized();
    let started = Instant::now();
    let start = if filter.is_empty() { q.offset } else { q.from };
    let max_scan = if filter.is_empty() {
        limit as u64
    } else {
        MAX_SCAN_PER_PAGE
    };
    let found = scan(&state, &queue, &filter, start, limit, max_scan).await?;
    let now = state.admin.server_time_ms().await?;
    let took = started.elapsed();

    let base = |extra: &str| {
        let mut url = format!("/queues/{}/dead?limit={limit}", url_segment(&queue));
        if let Some(t) = &filter.job_type {
            url.push_str(&format!("&type={}", url_segment(t)));
        }
        if let Some(c) = &filter.contains {
            url.push_str(&format!("&contains={}", url_segment(c)));
        }
        url.push_str(extra);
        url
    };
    let trail: Vec<u64> = q.trail.split(',').filter_map(|s| s.parse().ok()).collect();
    let (range, prev, next) = if filter.is_empty() {
        let shown = found.rows.len() as u64;
        let range = if shown == 0 {
            format!("none of {} shown", found.total)
        } else {
            format!("{}–{} of {}", q.offset + 1, q.offset + shown, found.total)
        };
        let prev = (q.offset > 0).then(|| {
            base(&format!(
                "&offset={}",
                q.offset.saturating_sub(limit as u64)
            ))
        });
        let next = found.next.map(|n| base(&format!("&offset={n}")));
        (range, prev, next)
    } else {
        let range = format!(
            "{} matching among entries {}–{} of {} ({} read)",
            found.rows.len(),
            q.from.saturating_add(1),
            q.from.saturating_add(found.scanned),
            found.total,
            found.scanned
        );
        let prev = trail
            .split_last()
            .map(|(last, rest)| base(&format!("&from={last}&trail={}", join(rest))));
        let next = found.next.map(|n| {
            let mut t = trail.clone();
            t.push(q.from);
            let skip = t.len().saturating_sub(MAX_TRAIL);
            base(&format!("&from={n}&trail={}", join(&t[skip..])))
        });
        (range, prev, next)
    };
    Ok(Html(render(
        &queue,
        &filter,
        &found.rows,
        now,
        View {
            range,
            prev,
            next,
            first: base(""),
            took_ms: took.as_secs_f64() * 1000.0,
            limit,
        },
    )))
}

fn join(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

struct View {
    range: String,
    prev: Option<String>,
    next: Option<String>,
    first: String,
    took_ms: f64,
    limit: usize,
}

/// A row's `dead_at` relative to `now` (`3m05s ago`), read as the CLI's
/// `dead list` reads it (`parse_ms`): `–` when it is no time (none, `0`,
/// negative, garbage). Before, any i64 was taken: a hand-edited
/// `-9223372036854775808` overflowed `now - t` (a panic in a debug build).
fn died(dead_at: Option<&str>, now: i64) -> String {
    dead_at
        .and_then(queue_core::admin::parse_ms)
        .map(|t| fmt_rel(t, now))
        .unwrap_or_else(|| "–".into())
}

fn render(queue: &str, filter: &DeadFilter, rows: &[DeadRow], now: i64, v: View) -> String {
    let qa = html(queue);
    let mut body = String::new();
    for r in rows {
        let died = died(r.dead_at.as_deref(), now);
        body.push_str(&format!(
            r#"<tr data-id="{ida}"><td><a class="job" href="/queues/{qu}/jobs/{idu}">{ida}</a></td><td>{ty}</td><td class="num">{att}</td><td class="num">{died}</td><td class="reason">{reason}</td><td class="action"><button class="replay" type="button" data-queue="{qa}" data-id="{ida}">Replay</button> <span class="result"></span></td></tr>"#,
            ida = html(&r.id),
            idu = url_segment(&r.id),
            qu = url_segment(queue),
            ty = html(r.job_type.as_deref().unwrap_or("?")),
            att = html(r.attempts.as_deref().unwrap_or("")),
            reason = html(r.reason.as_deref().or(r.unreadable.as_deref()).unwrap_or("?")),
        ));
    }
    if rows.is_empty() {
        body.push_str(
            r#"<tr><td colspan="6" class="muted">No dead letter on this page.</td></tr>"#,
        );
    }
    let link = |href: &Option<String>, id: &str, label: &str| match href {
        Some(h) => format!(
            r#"<a class="pager" id="{id}" href="{}">{label}</a>"#,
            html(h)
        ),
        None => format!(r#"<span class="pager muted" id="{id}">{label}</span>"#),
    };
    let value = |s: &Option<String>| html(s.as_deref().unwrap_or(""));
    let content = format!(
        r#"<div id="page" data-page="dead"></div>
<p class="crumbs"><a href="/">Queues</a> › <a href="/queues/{qu}">{qa}</a> › dead letters</p>
<h1>Dead letters of {qa}</h1>
<form class="filter" id="dead-filter" method="get" action="/queues/{qu}/dead">
<label>type <input name="type" value="{ty}" placeholder="any"></label>
<label>error contains <input name="contains" value="{contains}" placeholder="any text"></label>
<input type="hidden" name="limit" value="{limit}">
<button type="submit">Filter</button> <a href="/queues/{qu}/dead">clear</a>
</form>
<section class="bulk" id="bulk" data-queue="{qa}" data-type="{ty}" data-contains="{contains}">
<button type="button" id="bulk-preview">Replay or purge all matching ({what})…</button>
<div id="bulk-confirm" hidden>
<p id="bulk-count"></p>
<button type="button" class="bulk-act" id="bulk-replay" data-action="replay">Replay</button>
<button type="button" class="bulk-act danger" id="bulk-purge" data-action="purge">Purge for good</button>
<button type="button" id="bulk-cancel">Cancel</button>
</div>
<p class="result" id="bulk-result"></p>
</section>
<p class="pagers">{first} {prev} <span id="dead-range">{range}</span> {next}</p>
<table class="grid" id="dead"><thead><tr><th>job</th><th>type</th><th class="num">attempts</th><th class="num">died</th><th>reason</th><th></th></tr></thead>
<tbody>{body}</tbody></table>
<p class="muted small" id="dead-timing">page read in {took:.1} ms</p>"#,
        qu = url_segment(queue),
        ty = value(&filter.job_type),
        contains = value(&filter.contains),
        limit = v.limit,
        what = html(&filter.describe()),
        first = link(&Some(v.first.clone()), "dead-first", "« first"),
        prev = link(&v.prev, "dead-prev", "‹ previous"),
        next = link(&v.next, "dead-next", "next ›"),
        range = html(&v.range),
        took = v.took_ms,
    );
    pages::layout(&format!("Dead letters of {queue}"), &content)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dead letters whose `dead_at` was hand-edited to either end of i64
    /// (or to garbage) are shown on the page: `–` for one that is no time,
    /// a distance for one far ahead. Before, `-9223372036854775808` was
    /// taken as a time and `now - t` overflowed: a panic in a debug build,
    /// the page never rendered.
    #[test]
    fn a_page_shows_a_dead_at_at_either_end_of_i64() {
        let now = 1_733_144_701_123;
        let row = |id: &str, dead_at: &str| DeadRow {
            id: id.into(),
            job_type: Some("send".into()),
            reason: Some("boom".into()),
            dead_at: Some(dead_at.into()),
            attempts: Some("3".into()),
            unreadable: None,
        };
        let rows = [
            row("min", &i64::MIN.to_string()),
            row("max", &i64::MAX.to_string()),
            row("garbage", "yesterday"),
            row("recent", &(now - 2_000).to_string()),
        ];
        let view = View {
            range: String::new(),
            prev: None,
            next: None,
            first: String::new(),
            took_ms: 0.0,
            limit: 100,
        };
        let page = render("q", &DeadFilter::default(), &rows, now, view);
        let died = |id: &str| {
            let at = page.find(&format!(r#"data-id="{id}""#)).expect("a row");
            let cells: Vec<&str> = page[at..].split(r#"<td class="num">"#).collect();
            cells[2].split('<').next().unwrap().to_string()
        };
        assert_eq!(died("min"), "–");
        assert!(died("max").starts_with("in "), "{}", died("max"));
        assert_eq!(died("garbage"), "–");
        assert_eq!(died("recent"), "2.0s ago");
    }
}
