//! The dashboard's HTML. Every value that comes from Redis goes through
//! [`html`] (text) or [`url_segment`] (links): job ids, reasons and payloads
//! are user data.

use queue_core::admin::{
    JobDetail, JobInfo, LeaseStatus, Location, ProcessingJob, QueueHealth, WaitingJob,
};

use super::escape::{html, url_segment};
use super::sampler::DoctorSummary;
use super::Discovery;
use crate::doctor::{Finding, Severity};
use crate::format::{display_field, fmt_dur, fmt_rel, fmt_ts, payload_json};
use crate::history_view::{entry_delivery, entry_name};
use crate::views::{describe_where, event_detail, event_name};

/// A processing entry's lease status in a few words.
pub fn lease_label(status: LeaseStatus) -> &'static str {
    match status {
        LeaseStatus::Running => "running",
        LeaseStatus::Expired => "lost: lease expired",
        LeaseStatus::Unleased => "unclaimed: no lease",
    }
}

/// An optional number as cell text ("" when missing).
fn opt_num(n: Option<u32>) -> String {
    n.map(|n| n.to_string()).unwrap_or_default()
}

pub fn layout(title: &str, body: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · queue dashboard</title>
<link rel="stylesheet" href="/assets/style.css">
<script src="/assets/app.js" defer></script>
<script src="/assets/oncall.js" defer></script>
</head><body>
<header><a class="brand" href="/">queue dashboard</a><nav><a href="/">Queues</a><a href="/doctor">Redis doctor</a></nav><form class="search" method="get" action="/search"><input name="id" placeholder="find job id" aria-label="job id" required></form></header>
<main>
{body}
</main>
</body></html>"#,
        title = html(title),
    )
}

fn opt_dur(ms: Option<u64>) -> String {
    ms.map(fmt_dur).unwrap_or_else(|| "–".to_string())
}

fn job_link(queue: &str, id: &str) -> String {
    format!(
        r#"<a class="job" href="/queues/{}/jobs/{}">{}</a>"#,
        url_segment(queue),
        url_segment(id),
        html(id)
    )
}

fn doctor_banner(d: Option<&DoctorSummary>) -> String {
    match d {
        None => r#"<p class="banner muted" id="doctor-banner">Redis durability: checking…</p>"#
            .to_string(),
        Some(d) if d.error.is_some() => format!(
            r#"<p class="banner bad" id="doctor-banner">Redis durability: cannot check ({}) — <a href="/doctor">details</a></p>"#,
            html(d.error.as_deref().unwrap_or(""))
        ),
        Some(d) if d.safe => format!(
            r#"<p class="banner good" id="doctor-banner">Redis durability: safe for critical queues ({} warning(s)) — <a href="/doctor">details</a></p>"#,
            d.warnings
        ),
        Some(d) => format!(
            r#"<p class="banner bad" id="doctor-banner">Redis durability: NOT SAFE — {} setting(s) can lose queue data — <a href="/doctor">see the doctor</a></p>"#,
            d.critical
        ),
    }
}

/// The overview's row when it lists no queue: "not known yet" while the
/// first discovery runs (or keeps failing), else "none found".
fn no_queue_row(discovery: &Discovery) -> String {
    let text = match discovery {
        Discovery::InProgress { error: None } => "Discovering queues: the first scan of the keyspace for queue keys is in progress (it can take a while on a large Redis). The list fills in when it ends; name the queues with --queue to skip it.".to_string(),
        Discovery::InProgress { error: Some(e) } => format!(
            "Queue discovery has not succeeded yet (last attempt: {}); it is retried in the background. Name the queues with --queue to skip it.",
            html(e)
        ),
        Discovery::Named | Discovery::Done => {
            "No queue found (nothing enqueued yet, or name them with --queue).".to_string()
        }
    };
    let cls = match discovery {
        Discovery::InProgress { error: Some(_) } => "bad",
        _ => "muted",
    };
    format!(r#"<tr><td colspan="11" class="{cls}" id="no-queue">{text}</td></tr>"#)
}

pub fn overview(
    queues: &[QueueHealth],
    doctor: Option<&DoctorSummary>,
    refresh_ms: u64,
    discovery: &Discovery,
) -> String {
    let mut rows = String::new();
    for h in queues {
        let q = &h.stats;
        let cell = |k: &str, v: String, cls: &str| {
            format!(
                r#"<td class="num {cls}" data-q="{}" data-k="{k}">{v}</td>"#,
                html(&q.queue)
            )
        };
        let lost_cls = if h.expired_leases > 0 { "warn" } else { "" };
        let dead_cls = if q.dead > 0 { "warn" } else { "" };
        rows.push_str(&format!(
            r#"<tr data-queue="{qa}"><td><a href="/queues/{qu}">{qa}</a></td>{}{}{}{}{}{}{}{}{}{}</tr>"#,
            cell("main", q.main.to_string(), ""),
            cell("oldest_waiting", opt_dur(q.oldest_waiting_ms), ""),
            cell("processing", q.processing.to_string(), ""),
            cell("expired_leases", h.expired_leases.to_string(), lost_cls),
            cell("delayed", q.delayed.to_string(), ""),
            cell("dead", q.dead.to_string(), dead_cls),
            cell("completed_last_minute", q.completed_last_minute.to_string(), ""),
            cell("retried", q.counter("retried").to_string(), ""),
            cell("dead_lettered", q.counter("dead").to_string(), ""),
            cell("reclaimed", q.counter("reclaimed").to_string(), ""),
            qa = html(&q.queue),
            qu = url_segment(&q.queue),
        ));
    }
    if queues.is_empty() {
        rows.push_str(&no_queue_row(discovery));
    }
    // The page's script reloads it once the API says the discovery ended.
    let discovering = matches!(discovery, Discovery::InProgress { .. });
    let body = format!(
        r#"<div id="page" data-page="overview" data-refresh="{refresh_ms}" data-discovering="{discovering}"></div>
{banner}
<h1>Queues</h1>
<table class="grid" id="queues">
<thead><tr><th>queue</th><th class="num" title="jobs waiting in main">waiting</th><th class="num" title="age of the oldest waiting job: high means slow (too few workers)">oldest waiting</th><th class="num" title="taken by workers">processing</th><th class="num" title="processing with an expired lease: lost deliveries the watchdog must return">lost</th><th class="num" title="retries and scheduled jobs">delayed</th><th class="num">dead</th><th class="num" title="completions in the last 60 s">done / min</th><th class="num">retried</th><th class="num">dead-lettered</th><th class="num" title="expired leases returned by the watchdog">reclaimed</th></tr></thead>
<tbody>{rows}</tbody>
</table>
<h2>Throughput <span class="muted small">(per second, sampled every {sample})</span></h2>
<div class="chart-box"><canvas id="chart" width="1100" height="260" data-points="0"></canvas><div id="legend" class="legend"></div></div>
<p class="muted small">Solid: completed per second. Dashed: enqueued per second. <span id="updated"></span></p>"#,
        banner = doctor_banner(doctor),
        sample = fmt_dur(refresh_ms),
    );
    layout("Queues", &body)
}

pub struct QueueView<'a> {
    pub health: &'a QueueHealth,
    pub now: i64,
    pub processing: &'a [ProcessingJob],
    pub main: &'a [WaitingJob],
    pub delayed: &'a [WaitingJob],
    pub dead: &'a [JobInfo],
    pub dead_total: u64,
}

/// The type cell of a listing row, or why the row's job key cannot be read
/// (corrupt data: a key of another type).
fn type_cell(job_type: Option<&str>, unreadable: Option<&str>) -> String {
    match unreadable {
        Some(why) => format!(r#"<td class="bad">{}</td>"#, html(why)),
        None => format!("<td>{}</td>", html(job_type.unwrap_or(""))),
    }
}

fn lease_cell(j: &ProcessingJob) -> String {
    match (j.status, j.lease_until, j.lease_left_ms) {
        (LeaseStatus::Running, Some(until), Some(left)) => format!(
            r#"<td class="num lease" data-lease-until="{until}">{}</td>"#,
            fmt_dur(left as u64)
        ),
        (LeaseStatus::Expired, Some(until), Some(left)) => format!(
            r#"<td class="num lease bad" data-lease-until="{until}">expired {} ago</td>"#,
            fmt_dur(left.unsigned_abs())
        ),
        _ => r#"<td class="num lease muted">no lease</td>"#.to_string(),
    }
}

pub fn processing_rows(queue: &str, jobs: &[ProcessingJob], now: i64) -> String {
    let mut s = String::new();
    for j in jobs {
        let cls = match j.status {
            LeaseStatus::Running => "",
            _ => "bad",
        };
        s.push_str(&format!(
            r#"<tr data-id="{}"><td>{}</td>{}<td class="num">{} / {}</td><td class="num">{}</td>{}<td class="status {cls}">{}</td></tr>"#,
            html(j.id.as_str()),
            job_link(queue, j.id.as_str()),
            type_cell(j.job_type.as_deref(), j.unreadable.as_deref()),
            opt_num(j.attempts),
            opt_num(j.max_attempts),
            j.delivered_at.map(|t| fmt_dur((now - t).max(0) as u64)).unwrap_or_else(|| "–".into()),
            lease_cell(j),
            lease_label(j.status),
        ));
    }
    if jobs.is_empty() {
        s.push_str(r#"<tr><td colspan="6" class="muted">No job is being processed.</td></tr>"#);
    }
    s
}

pub fn queue(v: QueueView<'_>) -> String {
    let h = v.health;
    let s = &h.stats;
    let q = &s.queue;
    let cards = format!(
        r#"<div class="cards">
<div class="card"><div class="k">waiting</div><div class="v">{}</div><div class="s">oldest {}</div></div>
<div class="card"><div class="k">processing</div><div class="v">{}</div><div class="s">{} lost · {} unclaimed</div></div>
<div class="card"><div class="k">delayed</div><div class="v">{}</div><div class="s">{} due now</div></div>
<div class="card"><div class="k">dead</div><div class="v">{}</div><div class="s">{} dead-lettered in total</div></div>
<div class="card"><div class="k">done / min</div><div class="v">{}</div><div class="s">{} completed in total</div></div>
</div>"#,
        s.main,
        opt_dur(s.oldest_waiting_ms),
        s.processing,
        h.expired_leases,
        h.unleased,
        s.delayed,
        h.delayed_due,
        s.dead,
        s.counter("dead"),
        s.completed_last_minute,
        s.counter("completed"),
    );
    let mut dead = String::new();
    for j in v.dead {
        let dead_at = j
            .field("dead_at")
            .and_then(|t| t.parse::<i64>().ok())
            .map(|t| fmt_rel(t, v.now))
            .unwrap_or_else(|| "–".into());
        dead.push_str(&format!(
            r#"<tr data-id="{ida}"><td>{link}</td><td>{ty}</td><td class="num">{att}</td><td class="num">{dead_at}</td><td class="reason">{reason}</td><td class="action"><button class="replay" type="button" data-queue="{qa}" data-id="{ida}">Replay</button> <span class="result"></span></td></tr>"#,
            ida = html(j.id.as_str()),
            link = job_link(q, j.id.as_str()),
            ty = html(j.field("type").unwrap_or("?")),
            att = j.attempts(),
            reason = html(j.field("dead_reason").unwrap_or("?")),
            qa = html(q),
        ));
    }
    if v.dead.is_empty() {
        dead.push_str(
            r#"<tr><td colspan="6" class="muted">The dead-letter list is empty.</td></tr>"#,
        );
    }
    let more = if v.dead_total > v.dead.len() as u64 {
        format!(
            r#"<p class="muted small" id="dead-more">{} more: <a href="/queues/{}/dead?offset={}">all dead letters, in pages</a> (filter, bulk replay or purge)</p>"#,
            v.dead_total - v.dead.len() as u64,
            url_segment(q),
            v.dead.len()
        )
    } else {
        String::new()
    };
    let waiting = |rows: &[WaitingJob], delayed: bool| {
        let mut s = String::new();
        for j in rows {
            let when =
                j.at.map(|t| {
                    if delayed {
                        format!("{} ({})", fmt_rel(t, v.now), fmt_ts(t))
                    } else {
                        fmt_rel(t, v.now)
                    }
                })
                .unwrap_or_else(|| "–".into());
            s.push_str(&format!(
                r#"<tr><td>{}</td>{}<td class="num">{}</td><td class="num">{}</td><td class="reason">{}</td></tr>"#,
                job_link(q, j.id.as_str()),
                type_cell(j.job_type.as_deref(), j.unreadable.as_deref()),
                opt_num(j.attempts),
                when,
                html(j.last_error.as_deref().unwrap_or(""))
            ));
        }
        if rows.is_empty() {
            s.push_str(r#"<tr><td colspan="5" class="muted">None.</td></tr>"#);
        }
        s
    };
    let body = format!(
        r#"<div id="page" data-page="queue" data-queue="{qa}" data-now="{now}"></div>
<p class="crumbs"><a href="/">Queues</a> › {qa}</p>
<h1>Queue {qa}</h1>
<p class="links"><a href="/queues/{qu}/batches" id="batches-link">Batches</a> (batches, flows and DAGs of this queue)</p>
{flow}
{cards}
<h2>Processing <span class="muted small">(oldest first; a lost job has an expired lease: its worker died or stalled, and the watchdog returns it)</span></h2>
<table class="grid" id="processing"><thead><tr><th>job</th><th>type</th><th class="num">attempt</th><th class="num">running for</th><th class="num">lease left</th><th>status</th></tr></thead>
<tbody>{processing}</tbody></table>
<h2>Dead letters <span class="muted small">(newest first, {dead_total} in all: <a href="/queues/{qu}/dead" id="dead-all">browse in pages, filter, bulk replay or purge</a>)</span></h2>
<table class="grid" id="dead"><thead><tr><th>job</th><th>type</th><th class="num">attempts</th><th class="num">died</th><th>reason</th><th></th></tr></thead>
<tbody>{dead}</tbody></table>
{more}
<h2>Waiting <span class="muted small">(next to run first)</span></h2>
<table class="grid" id="waiting"><thead><tr><th>job</th><th>type</th><th class="num">attempts</th><th class="num">enqueued</th><th>last error</th></tr></thead>
<tbody>{main}</tbody></table>
<h2>Delayed <span class="muted small">(retries and scheduled jobs, soonest first)</span></h2>
<table class="grid" id="delayed"><thead><tr><th>job</th><th>type</th><th class="num">attempts</th><th class="num">runs</th><th>last error</th></tr></thead>
<tbody>{delayed}</tbody></table>"#,
        qa = html(q),
        qu = url_segment(q),
        now = v.now,
        flow = pause_controls(q, s.paused_since_ms),
        processing = processing_rows(q, v.processing, v.now),
        dead_total = v.dead_total,
        main = waiting(v.main, false),
        delayed = waiting(v.delayed, true),
    );
    layout(&format!("Queue {q}"), &body)
}

/// The paused banner (when paused) and the Pause / Resume button.
fn pause_controls(q: &str, paused_since: Option<i64>) -> String {
    let qa = html(q);
    match paused_since {
        Some(since) => format!(
            r#"<p class="banner bad" id="paused-banner">Paused since {}: workers start none of its jobs; enqueue still works, running jobs finish. <button class="flow" type="button" data-action="resume" data-queue="{qa}">Resume</button> <span class="result"></span></p>"#,
            fmt_ts(since)
        ),
        None => format!(
            r#"<p class="flow-controls"><button class="flow" type="button" data-action="pause" data-queue="{qa}">Pause</button> <span class="result"></span></p>"#
        ),
    }
}

/// The Cancel button of a job that is waiting, delayed or running.
fn cancel_control(d: &JobDetail) -> String {
    match d.location {
        Location::Main { .. } | Location::Delayed { .. } | Location::Processing { .. } => {
            format!(
                r#"<p><button class="cancel" type="button" data-queue="{}" data-id="{}">Cancel this job</button> <span class="result"></span></p>"#,
                html(&d.queue),
                html(d.id.as_str())
            )
        }
        _ => String::new(),
    }
}

/// How much of a job's payload the job page shows (its JSON text), and of
/// each other field's value: the page stays small whatever the job holds (a
/// payload of megabytes rendered whole made a page of megabytes, escaped).
const PAYLOAD_SHOWN: usize = 64 * 1024;
const FIELD_SHOWN: usize = 4 * 1024;

/// The first `limit` bytes of `text` (cut at a character boundary), and a
/// note of how much was left out, naming the command that prints it whole.
fn shown<'a>(text: &'a str, limit: usize, d: &JobDetail) -> (&'a str, String) {
    if text.len() <= limit {
        return (text, String::new());
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let note = format!(
        r#"<p class="muted small cut">… {} more bytes not shown: <code>queue-watchdog jobs show {} -q {}</code> prints the job whole.</p>"#,
        text.len() - end,
        html(d.id.as_str()),
        html(&d.queue)
    );
    (&text[..end], note)
}

pub fn job(d: &JobDetail, batches: &str) -> String {
    let q = &d.queue;
    let location_cls = match &d.location {
        Location::Processing {
            status: LeaseStatus::Running,
            ..
        }
        | Location::Main { .. }
        | Location::Completed => "good",
        Location::Delayed { .. } => "",
        _ => "bad",
    };
    let mut fields = String::new();
    for (k, val) in d.job.iter().flat_map(|j| &j.fields) {
        let val = display_field(k, val);
        let (val, cut) = shown(&val, FIELD_SHOWN, d);
        fields.push_str(&format!(
            "<tr><th>{}</th><td>{}{cut}</td></tr>",
            html(k),
            html(val)
        ));
    }
    let progress = crate::format::progress_line(|k| d.field(k))
        .map(|p| {
            format!(
                r#"<p class="progress" id="progress">Progress: {}</p>"#,
                html(&p)
            )
        })
        .unwrap_or_default();
    let mut history = String::new();
    for e in &d.history {
        history.push_str(&format!(
            r#"<li><span class="when">{}</span> <span class="ago muted">({})</span> <b>{}</b> {}</li>"#,
            html(&fmt_ts(e.at)),
            fmt_rel(e.at, d.now_ms),
            html(event_name(&e.kind)),
            html(&event_detail(&e.kind))
        ));
    }
    let mut journal = String::new();
    for e in &d.journal {
        journal.push_str(&format!(
            r#"<tr class="{}"><td class="when">{}</td><td><b>{}</b></td><td>{}</td><td>{}</td></tr>"#,
            html(e.kind.as_str()),
            html(&fmt_ts(e.at)),
            html(entry_name(e)),
            html(&entry_delivery(e)),
            html(e.detail.as_deref().unwrap_or(""))
        ));
    }
    let completion = match &d.completion {
        Some(c) => {
            let mut s = String::from(r#"<h2>Completion record</h2><table class="kv">"#);
            for (k, val) in c {
                s.push_str(&format!(
                    "<tr><th>{}</th><td>{}</td></tr>",
                    html(k),
                    html(&display_field(k, val))
                ));
            }
            s.push_str("</table>");
            s
        }
        None => String::new(),
    };
    let steps = if d.steps.is_empty() {
        String::new()
    } else {
        format!(
            "<h2>Steps done</h2><p>{}</p>",
            d.steps
                .iter()
                .map(|s| html(s))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let replay = if matches!(d.location, Location::Dead { .. }) {
        format!(
            r#"<p><button class="replay" type="button" data-queue="{}" data-id="{}">Replay this job</button> <span class="result"></span></p>"#,
            html(q),
            html(d.id.as_str())
        )
    } else {
        String::new()
    };
    let (payload, bytes) = match &d.job {
        Some(j) => (payload_json(&j.payload), j.payload.len()),
        None => (serde_json::Value::Null, 0),
    };
    let payload = serde_json::to_string_pretty(&payload).unwrap_or_default();
    let (payload, payload_cut) = shown(&payload, PAYLOAD_SHOWN, d);
    let body = format!(
        r#"<div id="page" data-page="job"></div>
<p class="crumbs"><a href="/">Queues</a> › <a href="/queues/{qu}">{qa}</a> › job</p>
<h1>Job <code id="job-id">{ida}</code></h1>
<p class="location {location_cls}" id="location">{location}</p>
{batches}
{progress}
{replay}
{cancel}
<h2>Deliveries</h2>
<table class="journal" id="journal"><tr><th>when</th><th>what</th><th>delivery</th><th>detail</th></tr>{journal}</table>
<h2>History</h2>
<ul class="history">{history}</ul>
<p class="muted small">The job hash keeps the latest time of each kind of event (an earlier failure is overwritten by a later one).</p>
<h2>Fields</h2>
<table class="kv" id="fields">{fields}</table>
<h2>Payload <span class="muted small">({bytes} bytes of MessagePack)</span></h2>
<pre class="payload">{payload}</pre>{payload_cut}
{completion}
{steps}"#,
        qu = url_segment(q),
        qa = html(q),
        ida = html(d.id.as_str()),
        location = html(&describe_where(d)),
        cancel = cancel_control(d),
        payload = html(payload),
    );
    layout(&format!("Job {}", d.id), &body)
}

pub fn doctor(findings: &[Finding], safe: bool) -> String {
    let mut rows = String::new();
    for f in findings {
        let cls = match f.severity {
            Severity::Critical => "bad",
            Severity::Warning => "warn",
            Severity::Info => "muted",
            Severity::Ok => "good",
        };
        rows.push_str(&format!(
            r#"<tr><td class="sev {cls}">{}</td><td>{}</td><td>{}<div class="muted small">{}</div></td><td><pre class="fix">{}</pre></td></tr>"#,
            f.severity.label(),
            html(f.check),
            html(&f.what),
            html(&f.why),
            html(&f.fix),
        ));
    }
    let verdict = if safe {
        r#"<p class="banner good">Safe for critical queues: nothing found that loses acknowledged jobs.</p>"#
    } else {
        r#"<p class="banner bad">NOT SAFE for critical queues: apply the fixes of the CRITICAL lines.</p>"#
    };
    let body = format!(
        r#"<h1>Redis doctor</h1>{verdict}
<table class="grid" id="findings"><thead><tr><th>severity</th><th>check</th><th>finding</th><th>fix</th></tr></thead><tbody>{rows}</tbody></table>
<p class="muted small">Same checks as <code>queue-watchdog doctor</code>; see docs/OPERATIONS.md.</p>"#
    );
    layout("Redis doctor", &body)
}
