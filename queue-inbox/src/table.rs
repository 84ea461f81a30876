//! The SQL of the inbox table. The name is validated by `queue-outbox`'s
//! [`TableName`] (same rules as the outbox's) and always quoted.

use queue_outbox::TableName;

/// Columns read into an [`InboxRecord`](crate::InboxRecord), in this order.
pub(crate) const COLUMNS: &str = "queue, key, job_id, status, fence, attempts, worker, \
     result_ref, started_at, finished_at, job_type";

pub(crate) fn migrate_sql(t: &TableName) -> String {
    // Looks everything up first and changes only what is missing (no lock on
    // an up-to-date table), serialised by an advisory lock on the
    // schema-qualified name: see `TableName::migration_sql`.
    t.migration_sql(
        "queue_inbox",
        "
    queue       text        NOT NULL CHECK (queue <> ''),
    key         text        NOT NULL CHECK (key <> ''),
    job_id      text        NOT NULL CHECK (job_id <> ''),
    status      text        NOT NULL CHECK (status IN ('running', 'done')),
    fence       bigint      NOT NULL,
    attempts    int         NOT NULL,
    worker      text        NOT NULL,
    result_ref  text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    job_type    text,
    PRIMARY KEY (queue, key)
",
        // Added after the first release: NULL in rows written before it (or
        // by a worker of an older version during a rolling upgrade).
        &[("job_type", "text")],
        &[
            ("job_idx", "(queue, job_id)"),
            ("finished_idx", "(finished_at) WHERE status = 'done'"),
        ],
    )
}

/// Inserts a `running` row; returns nothing when the (queue, key) row exists.
/// Waits while another transaction holds an uncommitted row with that key.
pub(crate) fn claim_insert_sql(t: &TableName) -> String {
    format!(
        "INSERT INTO {} (queue, key, job_id, status, fence, attempts, worker, started_at, job_type) \
         VALUES ($1, $2, $3, 'running', $4, $5, $6, now(), $7) \
         ON CONFLICT (queue, key) DO NOTHING RETURNING 1",
        t.quoted()
    )
}

/// The existing row, locked for the rest of the transaction.
pub(crate) fn lock_row_sql(t: &TableName) -> String {
    format!(
        "SELECT {COLUMNS} FROM {} WHERE queue = $1 AND key = $2 FOR UPDATE",
        t.quoted()
    )
}

pub(crate) fn select_row_sql(t: &TableName) -> String {
    format!(
        "SELECT {COLUMNS} FROM {} WHERE queue = $1 AND key = $2",
        t.quoted()
    )
}

/// A `running` row (already locked) taken over by this delivery.
pub(crate) fn take_over_sql(t: &TableName) -> String {
    format!(
        "UPDATE {} SET job_id = $3, fence = $4, attempts = $5, worker = $6, started_at = now(), \
                job_type = $7 \
         WHERE queue = $1 AND key = $2 AND status = 'running'",
        t.quoted()
    )
}

/// `done`, only for the row this delivery claimed.
pub(crate) fn complete_sql(t: &TableName) -> String {
    format!(
        "UPDATE {} SET status = 'done', result_ref = $5, finished_at = now() \
         WHERE queue = $1 AND key = $2 AND job_id = $3 AND fence = $4 AND status = 'running' \
         RETURNING 1",
        t.quoted()
    )
}

pub(crate) fn prune_sql(t: &TableName) -> String {
    format!(
        "DELETE FROM {q} WHERE (queue, key) IN \
         (SELECT queue, key FROM {q} WHERE status = 'done' AND finished_at < $1 LIMIT $2)",
        q = t.quoted()
    )
}

pub(crate) fn stats_sql(t: &TableName) -> String {
    format!(
        "SELECT queue, \
                count(*) FILTER (WHERE status = 'running'), \
                count(*) FILTER (WHERE status = 'done'), \
                (extract(epoch FROM now() - min(started_at) FILTER (WHERE status = 'running')))::float8, \
                (extract(epoch FROM now() - max(finished_at)))::float8 \
         FROM {} GROUP BY queue ORDER BY queue",
        t.quoted()
    )
}

/// Outbox rows older than `$1` seconds (and not older than `$2`), of the
/// queues `$4` (all when NULL), with no `done` inbox row under their job id
/// (as key or as the job that completed the row); at most `$3`.
pub(crate) fn reconcile_sql(inbox: &TableName, outbox: &TableName) -> String {
    format!(
        "SELECT o.id, o.queue, o.job_id, o.job_type, o.created_at, o.published_at, \
                (extract(epoch FROM now() - o.created_at))::float8, \
                EXISTS (SELECT 1 FROM {i} r WHERE r.queue = o.queue \
                        AND (r.key = o.job_id OR r.job_id = o.job_id)), \
                o.rejected_at IS NOT NULL \
         FROM {o} o \
         WHERE o.created_at < now() - $1::bigint * interval '1 second' \
           AND ($2::bigint IS NULL OR o.created_at >= now() - $2::bigint * interval '1 second') \
           AND ($4::text[] IS NULL OR o.queue = ANY($4)) \
           AND NOT EXISTS (SELECT 1 FROM {i} d WHERE d.queue = o.queue AND d.status = 'done' \
                           AND (d.key = o.job_id OR d.job_id = o.job_id)) \
         ORDER BY o.id LIMIT $3",
        i = inbox.quoted(),
        o = outbox.quoted()
    )
}

/// Saves the transaction's `lock_timeout` (in a custom setting, so the
/// statement that puts it back needs no answer from this one and can be
/// sent in the same round trip) and sets the inbox's bound, for the rest
/// of the transaction until [`RESTORE_LOCK_TIMEOUT`] (both `SET LOCAL`).
pub(crate) fn bound_lock_timeout_sql(ms: u128) -> String {
    format!(
        "SELECT set_config('queue_inbox.saved_lock_timeout', current_setting('lock_timeout'), true); \
         SET LOCAL lock_timeout = '{ms}ms'"
    )
}

/// Puts back the `lock_timeout` that [`bound_lock_timeout_sql`] saved.
pub(crate) const RESTORE_LOCK_TIMEOUT: &str =
    "SELECT set_config('lock_timeout', current_setting('queue_inbox.saved_lock_timeout'), true)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_index_names_fit_postgres_identifier_limit() {
        let t = TableName::try_new(&"x".repeat(queue_outbox::MAX_IDENT_LEN)).unwrap();
        assert!(format!("{}_finished_idx", t.base()).len() <= 63);
        assert!(migrate_sql(&t).contains(&format!("\"{}_job_idx\"", t.base())));
    }
}
