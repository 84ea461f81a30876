//! `GET /queues/{queue}/batches` (a queue's batches, newest first, paged)
//! and `GET /queues/{queue}/batches/{id}` (one batch: state, counts,
//! expiry, callbacks or parent, members with their outcomes, the DAG's
//! steps if it belongs to one): views over `Admin::batches` /
//! `Admin::batch_detail` (docs/WORKFLOWS.md, "Operating batches"). The
//! queue page and a member job's page link here.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Html;
use queue_core::admin::{batch_links, Admin, BatchDetail, BatchRow, JobDetail, Page};
use serde::Deserialize;

use super::escape::{html, url_segment};
use super::handlers::AppError;
use super::{pages, Shared};
use crate::commands::batches::expiry;
use crate::format::{fmt_rel, fmt_ts};

/// Batches per page.
const PER_PAGE: u64 = 50;

#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    offset: u64,
}

fn batch_href(queue: &str, id: &str) -> String {
    format!("/queues/{}/batches/{}", url_segment(queue), url_segment(id))
}

fn job_href(queue: &str, id: &str) -> String {
    format!("/queues/{}/jobs/{}", url_segment(queue), url_segment(id))
}

fn state_cell(r: &BatchRow) -> String {
    let cls = match r.state.as_str() {
        "fired" if r.dead + r.cancelled + r.failed > 0 => "bad",
        "fired" => "good",
        _ => "",
    };
    format!(r#"<td class="state {cls}">{}</td>"#, html(&r.state))
}

/// The batches page of `queue`.
pub async fn list(
    State(state): State<Shared>,
    Path(queue): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Html<String>, AppError> {
    let page = state
        .admin
        .batches(&queue, Page::new(q.offset, PER_PAGE))
        .await?;
    let (qa, qu) = (html(&queue), url_segment(&queue));
    let mut rows = String::new();
    for r in &page.batches {
        rows.push_str(&format!(
            r#"<tr data-id="{ida}"><td><a href="{href}">{ida}</a></td>{state}<td class="num">{fin}/{total}</td><td class="num">{dead}</td><td class="num">{cancelled}</td><td>{created}</td><td>{expires}</td><td>{dag}</td></tr>"#,
            ida = html(&r.id),
            href = batch_href(&queue, &r.id),
            state = state_cell(r),
            fin = r.finished(),
            total = r.total,
            dead = r.dead,
            cancelled = r.cancelled,
            created = fmt_rel(r.created_at_ms, page.now_ms),
            expires = html(&expiry(r, page.now_ms)),
            dag = html(r.dag.as_deref().unwrap_or("")),
        ));
    }
    if rows.is_empty() {
        rows.push_str(r#"<tr><td colspan="8" class="muted">No batches.</td></tr>"#);
    }
    let next = page
        .next_offset
        .map(|n| {
            format!(r#"<p><a id="next" href="/queues/{qu}/batches?offset={n}">next page</a></p>"#)
        })
        .unwrap_or_default();
    let body = format!(
        r#"<div id="page" data-page="batches" data-queue="{qa}"></div>
<p class="crumbs"><a href="/">Queues</a> › <a href="/queues/{qu}">{qa}</a> › batches</p>
<h1>Batches of {qa}</h1>
<p class="muted small">{indexed} in the index, newest first (batches, flows and DAG steps; fired ones are kept 7 days, open ones expire unless sealed).</p>
<table class="grid" id="batches"><thead><tr><th>batch</th><th>state</th><th class="num">finished</th><th class="num">dead</th><th class="num">cancelled</th><th>created</th><th>expires</th><th>dag</th></tr></thead>
<tbody>{rows}</tbody></table>{next}"#,
        indexed = page.indexed,
    );
    Ok(Html(pages::layout(&format!("Batches of {queue}"), &body)))
}

/// One batch's page.
pub async fn show(
    State(state): State<Shared>,
    Path((queue, id)): Path<(String, String)>,
) -> Result<Html<String>, AppError> {
    match state.admin.batch_detail(&queue, &id).await? {
        Some(b) => Ok(Html(detail(&b))),
        None => Err(AppError::new(
            StatusCode::NOT_FOUND,
            format!("no batch {id:?} on queue {queue:?} (never created, expired 7 days after it fired, or never sealed and past its open TTL)"),
        )),
    }
}

fn detail(b: &BatchDetail) -> String {
    let r = &b.row;
    let (q, qa, qu) = (&b.queue, html(&b.queue), url_segment(&b.queue));
    let mut facts = format!(
        r#"<tr><th>state</th>{state}</tr><tr><th>members</th><td id="counts">{fin} finished of {total}: {ok} succeeded, {dead} dead, {cancelled} cancelled, {failed} failed (fail-parent)</td></tr><tr><th>created</th><td>{created}</td></tr>"#,
        state = state_cell(r),
        fin = r.finished(),
        total = r.total,
        ok = r.succeeded,
        dead = r.dead,
        cancelled = r.cancelled,
        failed = r.failed,
        created = fmt_ts(r.created_at_ms),
    );
    for (name, at) in [("sealed", r.sealed_at_ms), ("fired", r.fired_at_ms)] {
        if let Some(at) = at {
            facts.push_str(&format!("<tr><th>{name}</th><td>{}</td></tr>", fmt_ts(at)));
        }
    }
    if let (Some(at), "open") = (r.expires_at_ms, r.state.as_str()) {
        facts.push_str(&format!(
            r#"<tr><th>expires</th><td id="expires" class="bad">{} ({}) unless sealed: a producer that died before the seal and never retried</td></tr>"#,
            fmt_ts(at),
            html(&fmt_rel(at, b.now_ms))
        ));
    }
    if let Some(f) = &b.failed_child {
        facts.push_str(&format!(
            "<tr><th>first failure</th><td>{}</td></tr>",
            html(f)
        ));
    }
    for line in b.errors.iter().flat_map(|e| e.lines()) {
        facts.push_str(&format!(
            r#"<tr><th>error</th><td class="bad">{}</td></tr>"#,
            html(line)
        ));
    }
    for cb in &b.callbacks {
        facts.push_str(&format!(
            r#"<tr><th>{role}</th><td><a class="callback" href="{href}">{ida}</a> ({ty})</td></tr>"#,
            role = cb.role,
            href = job_href(q, &cb.id),
            ida = html(&cb.id),
            ty = html(&cb.job_type),
        ));
    }
    for (fq, fid) in &b.parent_feeds {
        facts.push_str(&format!(
            r#"<tr><th>feeds</th><td><a class="feeds" href="{}">{}</a></td></tr>"#,
            batch_href(fq, fid),
            html(fid)
        ));
    }
    let mut members = String::new();
    for m in &b.members {
        let cls = match m.outcome.as_str() {
            "succeeded" | "completed" => "good",
            "failed" | "dead" | "cancelled" => "bad",
            _ => "",
        };
        members.push_str(&format!(
            r#"<tr data-id="{ida}"><td><a href="{href}">{ida}</a>{place}</td><td>{counted}</td><td class="{cls}">{outcome}</td><td>{reason}</td></tr>"#,
            ida = html(&m.id),
            // A member on another queue: its job page is there.
            href = job_href(m.queue.as_deref().unwrap_or(q), &m.id),
            place = m
                .queue
                .as_deref()
                .map(|mq| format!(r#" <span class="muted member-queue">({})</span>"#, html(mq)))
                .unwrap_or_default(),
            counted = if m.counted { "counted" } else { "pending" },
            outcome = html(&m.outcome),
            reason = html(m.reason.as_deref().unwrap_or("")),
        ));
    }
    if members.is_empty() {
        members.push_str(r#"<tr><td colspan="4" class="muted">None registered.</td></tr>"#);
    }
    let dag = match &r.dag {
        None => String::new(),
        Some(dag) => {
            let mut steps = String::new();
            for s in &b.dag_steps {
                let job = format!("{dag}:{}", s.name);
                let waits = if s.after.is_empty() {
                    "—".to_string()
                } else {
                    format!(
                        r#"<a href="{}">{}</a>"#,
                        batch_href(q, &job),
                        html(&s.after.join(", "))
                    )
                };
                let this = if job == r.id { " class=\"this\"" } else { "" };
                steps.push_str(&format!(
                    r#"<tr{this}><td><a href="{href}">{name}</a></td><td>{waits}</td></tr>"#,
                    href = job_href(q, &job),
                    name = html(&s.name),
                ));
            }
            let partial = if b.dag_steps_total > b.dag_steps.len() {
                format!(
                    r#" <span class="muted small">({} steps in all; a DAG of more than 256 steps keeps only each step's own line on its batch)</span>"#,
                    b.dag_steps_total
                )
            } else {
                String::new()
            };
            format!(
                r#"<h2>DAG <code>{}</code>{partial}</h2>
<table class="grid" id="dag"><thead><tr><th>step</th><th>after</th></tr></thead><tbody>{steps}</tbody></table>"#,
                html(dag)
            )
        }
    };
    let shown = if b.members_sample {
        format!(", a sample of {} shown", b.members.len())
    } else {
        String::new()
    };
    let body = format!(
        r#"<div id="page" data-page="batch" data-queue="{qa}"></div>
<p class="crumbs"><a href="/">Queues</a> › <a href="/queues/{qu}">{qa}</a> › <a href="/queues/{qu}/batches">batches</a> › batch</p>
<h1>Batch <code id="batch-id">{ida}</code></h1>
<table class="kv" id="batch">{facts}</table>
{dag}
<h2>Members <span class="muted small">({total} registered{shown})</span></h2>
<table class="grid" id="members"><thead><tr><th>job</th><th>counted</th><th>outcome</th><th>reason</th></tr></thead><tbody>{members}</tbody></table>"#,
        ida = html(&r.id),
        total = b.members_total,
    );
    pages::layout(&format!("Batch {}", r.id), &body)
}

/// The job page's links to the batches the job belongs to, was spawned
/// by, or waits on (a flow parent's or DAG step's own batch).
pub async fn job_links(admin: &Admin, d: &JobDetail) -> String {
    let mut links: Vec<(String, String, String)> = d
        .job
        .as_ref()
        .map(batch_links)
        .unwrap_or_default()
        .into_iter()
        .map(|l| {
            let role = if l.role == "member" {
                "member of"
            } else {
                "spawned by"
            };
            (role.to_string(), l.queue, l.id)
        })
        .collect();
    let own = d.id.as_str();
    if !links
        .iter()
        .any(|(_, lq, lid)| lq == &d.queue && lid == own)
        && matches!(admin.batch_detail(&d.queue, own).await, Ok(Some(_)))
    {
        links.push(("waits on".to_string(), d.queue.clone(), own.to_string()));
    }
    if links.is_empty() {
        return String::new();
    }
    let items: Vec<String> = links
        .iter()
        .map(|(role, lq, lid)| {
            format!(
                r#"{role} <a class="batch-link" href="{}">batch {}</a>"#,
                batch_href(lq, lid),
                html(lid)
            )
        })
        .collect();
    format!(r#"<p id="batches">{}</p>"#, items.join(" · "))
}
