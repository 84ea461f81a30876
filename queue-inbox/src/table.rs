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

/// Deletes at most `$2` `done` rows finished before `$1`, oldest first.
///
/// The rows are picked through `finished_idx` into an array (of the table's
/// row type: the key is `(queue, key)`) and deleted by primary key, one
/// probe each. Before, `(queue, key) IN (SELECT .. LIMIT $2)` was planned as
/// a hash semi join over a sequential scan: every chunk read the whole table.
pub(crate) fn prune_sql(t: &TableName) -> String {
    format!(
        "DELETE FROM {q} t USING unnest(ARRAY(\
             SELECT x FROM {q} x WHERE x.status = 'done' AND x.finished_at < $1 \
             ORDER BY x.finished_at LIMIT $2)) o \
         WHERE t.queue = o.queue AND t.key = o.key",
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
///
/// Each look-up is its own (anti-)join on `(queue, key)` or `(queue,
/// job_id)`, the two indexes. One `NOT EXISTS (.. AND (d.key = o.job_id OR
/// d.job_id = o.job_id))` means the same, but PostgreSQL matched it on
/// `queue` alone (a hash anti join with the `OR` as a join filter, or a
/// `BitmapOr` with `queue` as a filter): each outbox row read every inbox
/// row of its queue (200 rows took 13 s against 940k done rows).
pub(crate) fn reconcile_sql(inbox: &TableName, outbox: &TableName) -> String {
    format!(
        "SELECT o.id, o.queue, o.job_id, o.job_type, o.created_at, o.published_at, \
                (extract(epoch FROM now() - o.created_at))::float8, \
                EXISTS (SELECT 1 FROM {i} r WHERE r.queue = o.queue AND r.key = o.job_id) \
                OR EXISTS (SELECT 1 FROM {i} r WHERE r.queue = o.queue AND r.job_id = o.job_id), \
                o.rejected_at IS NOT NULL \
         FROM {o} o \
         WHERE o.created_at < now() - $1::bigint * interval '1 second' \
           AND ($2::bigint IS NULL OR o.created_at >= now() - $2::bigint * interval '1 second') \
           AND ($4::text[] IS NULL OR o.queue = ANY($4)) \
           AND NOT EXISTS (SELECT 1 FROM {i} d WHERE d.queue = o.queue AND d.key = o.job_id \
                           AND d.status = 'done') \
           AND NOT EXISTS (SELECT 1 FROM {i} d WHERE d.queue = o.queue AND d.job_id = o.job_id \
                           AND d.status = 'done') \
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
    use crate::{Inbox, InboxReconcileOptions};
    use queue_outbox::tokio_postgres::Client;
    use queue_outbox::Outbox;
    use queue_testkit::postgres::{self, DropTable};
    use std::time::{Duration, SystemTime};

    const Q: &str = "plan_q";

    /// An inbox and an outbox table of their own (dropped at the end), with
    /// `seed` run on them (`$I`, `$O`: their quoted names) and then ANALYZEd,
    /// so that PostgreSQL plans as it would on a table of that size.
    struct Tables {
        client: Client,
        inbox: Inbox,
        outbox: Outbox,
        _guards: [DropTable; 2],
    }

    async fn tables(seed: &str) -> Option<Tables> {
        let url = postgres::require()?;
        let (i, o) = (
            postgres::unique_name("inbox"),
            postgres::unique_name("outbox"),
        );
        let guards = [DropTable::new(&url, &i), DropTable::new(&url, &o)];
        let client = queue_outbox::connect_postgres(&url).await.unwrap();
        let (inbox, outbox) = (
            Inbox::with_table(&i).unwrap(),
            Outbox::with_table(&o).unwrap(),
        );
        inbox.migrate(&client).await.unwrap();
        outbox.migrate(&client).await.unwrap();
        let seed = seed
            .replace("$I", inbox.table.quoted())
            .replace("$O", outbox.table_name().quoted());
        client.batch_execute(&seed).await.unwrap();
        client
            .batch_execute(&format!("ANALYZE {i}; ANALYZE {o}"))
            .await
            .unwrap();
        Some(Tables {
            client,
            inbox,
            outbox,
            _guards: guards,
        })
    }

    impl Tables {
        /// PostgreSQL's plan of `sql` with `params`, one line per row.
        async fn explain(
            &self,
            sql: &str,
            params: &[&(dyn queue_outbox::tokio_postgres::types::ToSql + Sync)],
        ) -> String {
            let rows = self
                .client
                .query(&format!("EXPLAIN {sql}"), params)
                .await
                .unwrap();
            rows.iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n")
        }

        async fn count(&self, filter: &str) -> i64 {
            let sql = format!(
                "SELECT count(*) FROM {} WHERE {filter}",
                self.inbox.table.quoted()
            );
            self.client.query_one(&sql, &[]).await.unwrap().get(0)
        }
    }

    /// 20 000 inbox rows done an hour ago in another queue and 40 000 in the
    /// outbox's: 2 000 outbox rows done half by key, half by a job id under
    /// a business key, and 38 000 done rows of other jobs. Then one outbox
    /// row of each kind: done by key, done by job id, running, never run.
    const RECONCILE_SEED: &str = "
        INSERT INTO $I (queue, key, job_id, status, fence, attempts, worker, finished_at)
            SELECT 'other_q', 'o-' || g, 'o-' || g, 'done', 1, 1, 'w', now() FROM generate_series(1, 20000) g;
        INSERT INTO $I (queue, key, job_id, status, fence, attempts, worker, finished_at)
            SELECT 'plan_q', CASE WHEN g % 2 = 0 THEN 'job-' || g ELSE 'biz-' || g END, 'job-' || g,
                   'done', 1, 1, 'w', now() FROM generate_series(1, 40000) g;
        INSERT INTO $O (job_id, queue, job_type, schema_version, max_attempts, payload, created_at)
            SELECT 'job-' || g, 'plan_q', 't', 1, 1, '\\x00', now() - interval '1 hour'
            FROM generate_series(1, 2000) g;
        INSERT INTO $O (job_id, queue, job_type, schema_version, max_attempts, payload, created_at)
            SELECT j, 'plan_q', 't', 1, 1, '\\x00', now() - interval '1 hour'
            FROM unnest(ARRAY['by-key', 'by-job', 'running', 'never']) j;
        INSERT INTO $I (queue, key, job_id, status, fence, attempts, worker, finished_at) VALUES
            ('plan_q', 'by-key', 'by-key', 'done', 1, 1, 'w', now()),
            ('plan_q', 'order-7', 'by-job', 'done', 1, 1, 'w', now()),
            ('plan_q', 'running', 'running', 'running', 1, 1, 'w', NULL);
    ";

    /// Regression: one `NOT EXISTS` with `d.key = o.job_id OR d.job_id =
    /// o.job_id` was planned as a match on `queue` alone with the `OR` as a
    /// filter (or a `BitmapOr` with `queue` as a filter), every outbox row
    /// reading every inbox row of its queue. Each look-up must now be an
    /// index (or hash) condition on the queue and the key or the job id,
    /// and the listing must be unchanged.
    #[tokio::test]
    async fn reconcile_looks_up_key_and_job_id_each_with_the_queue_and_lists_the_same_rows() {
        let Some(t) = tables(RECONCILE_SEED).await else {
            return;
        };
        let queues = Some(vec![Q.to_string()]);
        let plan = t
            .explain(
                &reconcile_sql(&t.inbox.table, t.outbox.table_name()),
                &[&0_i64, &None::<i64>, &1000_i64, &queues],
            )
            .await;
        assert!(!plan.contains("BitmapOr"), "{plan}");
        for line in plan.lines().filter(|l| l.contains("job_id")) {
            assert!(
                !line.contains(" OR "),
                "a look-up matches key or job id with OR: {line}\n{plan}"
            );
            if line.contains("Cond:") {
                assert!(
                    line.contains("queue"),
                    "probe without the queue: {line}\n{plan}"
                );
            }
        }

        let opts = InboxReconcileOptions::new(Duration::ZERO).queue(Q);
        let rows = t
            .inbox
            .reconcile(&t.client, &t.outbox, &opts)
            .await
            .unwrap();
        let listed: Vec<(&str, bool)> = rows
            .iter()
            .map(|r| (r.job_id.as_str(), r.inbox_running))
            .collect();
        assert_eq!(listed, [("running", true), ("never", false)]);
    }

    /// 25 000 rows done two days ago (three chunks), 40 000 done now and
    /// 1 000 running since two days.
    const PRUNE_SEED: &str = "
        INSERT INTO $I (queue, key, job_id, status, fence, attempts, worker, started_at, finished_at)
            SELECT 'q' || g % 3, 'old-' || g, 'old-' || g, 'done', 1, 1, 'w',
                   now() - interval '2 days', now() - interval '2 days' + g * interval '1 ms'
            FROM generate_series(1, 25000) g;
        INSERT INTO $I (queue, key, job_id, status, fence, attempts, worker, finished_at)
            SELECT 'q' || g % 3, 'new-' || g, 'new-' || g, 'done', 1, 1, 'w', now()
            FROM generate_series(1, 40000) g;
        INSERT INTO $I (queue, key, job_id, status, fence, attempts, worker, started_at)
            SELECT 'q' || g % 3, 'run-' || g, 'run-' || g, 'running', 1, 1, 'w', now() - interval '2 days'
            FROM generate_series(1, 1000) g;
    ";

    /// Regression: `(queue, key) IN (SELECT .. LIMIT n)` was planned as a
    /// hash semi join over a sequential scan, every 10 000-row chunk reading
    /// the whole table. The chunk must now be found through an index and
    /// deleted by primary key, and prune still delete exactly the old done
    /// rows, over several chunks.
    #[tokio::test]
    async fn prune_deletes_old_done_rows_by_index_chunk_after_chunk() {
        let Some(t) = tables(PRUNE_SEED).await else {
            return;
        };
        let cutoff = SystemTime::now() - Duration::from_secs(86_400);
        let plan = t
            .explain(&prune_sql(&t.inbox.table), &[&cutoff, &10_000_i64])
            .await;
        assert!(!plan.contains("Seq Scan"), "{plan}");

        let deleted = t
            .inbox
            .prune(&t.client, Duration::from_secs(86_400))
            .await
            .unwrap();
        assert_eq!(deleted, 25_000);
        assert_eq!(t.count("key LIKE 'old-%'").await, 0);
        assert_eq!(t.count("status = 'done'").await, 40_000);
        assert_eq!(t.count("status = 'running'").await, 1_000);
    }

    #[test]
    fn derived_index_names_fit_postgres_identifier_limit() {
        let t = TableName::try_new(&"x".repeat(queue_outbox::MAX_IDENT_LEN)).unwrap();
        assert!(format!("{}_finished_idx", t.base()).len() <= 63);
        assert!(migrate_sql(&t).contains(&format!("\"{}_job_idx\"", t.base())));
    }
}
