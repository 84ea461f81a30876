//! The outbox table's name and the SQL that uses it.
//!
//! The name is validated as a plain lower-case identifier (optionally
//! `schema.table`) and always double-quoted in SQL, so it can never inject SQL
//! and a reserved word works as a name. [`TableName`] is public so that other
//! crates with tables of their own (`queue-inbox`) apply the same rules.

use crate::error::{OutboxError, Result};

/// Longest accepted identifier part, in bytes: leaves room for the derived
/// index names (`<table>_unpublished_idx`) within PostgreSQL's 63-byte limit.
pub const MAX_IDENT_LEN: usize = 40;

/// Longest wait, in seconds, before a row Redis refused on its own is sent
/// again (the backoff doubles from 1 s up to this).
pub(crate) const MAX_RETRY_SECS: u32 = 600;

/// Longest wait of a migration for a lock on its table (`lock_timeout`), when
/// it has something to change: then it fails (SQLSTATE `55P03`) instead of
/// queueing every writer of the table behind it.
pub const MIGRATE_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
// [`TableName::migrate_action`] names the value.
const _: () = assert!(MIGRATE_LOCK_TIMEOUT.as_secs() == 5);

/// A validated table name: a plain lower-case identifier
/// (`[a-z_][a-z0-9_]*`, at most [`MAX_IDENT_LEN`] bytes), optionally
/// schema-qualified, with its double-quoted SQL form.
///
/// ```
/// use queue_outbox::TableName;
/// let t = TableName::try_new("billing.inbox").unwrap();
/// assert_eq!(t.quoted(), "\"billing\".\"inbox\"");
/// assert_eq!(t.base(), "inbox");
/// assert!(TableName::try_new("inbox; drop table users").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    /// As given (`queue_outbox`, `app.queue_outbox`).
    pub(crate) name: String,
    /// Quoted for SQL (`"queue_outbox"`, `"app"."queue_outbox"`).
    pub(crate) quoted: String,
    /// The table part alone, for derived names.
    pub(crate) base: String,
}

fn check_ident(part: &str) -> std::result::Result<(), &'static str> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("empty identifier"),
        Some(c) if c.is_ascii_lowercase() || c == '_' => {}
        Some(_) => return Err("must start with a lower-case ASCII letter or `_`"),
    }
    if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Err("only lower-case ASCII letters, digits and `_` are allowed");
    }
    if part.len() > MAX_IDENT_LEN {
        return Err("longer than 40 bytes");
    }
    Ok(())
}

impl TableName {
    pub(crate) fn parse(name: &str) -> Result<Self> {
        Self::try_new(name).map_err(|reason| OutboxError::InvalidTableName {
            name: name.to_string(),
            reason,
        })
    }

    /// Validates `name`; the error says why it was rejected.
    pub fn try_new(name: &str) -> std::result::Result<Self, &'static str> {
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() > 2 {
            return Err("at most one `.` (schema.table)");
        }
        for part in &parts {
            check_ident(part)?;
        }
        let quoted = parts
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(".");
        Ok(TableName {
            name: name.to_string(),
            quoted,
            base: parts[parts.len() - 1].to_string(),
        })
    }

    /// The name as given (`queue_outbox`, `app.queue_outbox`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name quoted for SQL (`"queue_outbox"`, `"app"."queue_outbox"`).
    pub fn quoted(&self) -> &str {
        &self.quoted
    }

    /// The table part alone (without the schema), for derived index names.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Columns read by the relay, in this order.
    pub(crate) const COLUMNS: &'static str =
        "id, job_id, queue, job_type, schema_version, max_attempts, payload, \
         created_at, published_at, rejected_at, attempts, last_error, run_at, extra, \
         next_attempt_at";

    /// The schema part, when the name is schema-qualified.
    pub fn schema(&self) -> Option<&str> {
        self.name.split_once('.').map(|(s, _)| s)
    }

    /// The migration of a table of this name as one PL/pgSQL block (one
    /// simple-query batch: one implicit transaction, or part of the caller's).
    ///
    /// It resolves the table's schema (the given one, else `current_schema()`,
    /// where `CREATE TABLE` puts an unqualified name), takes the advisory lock
    /// `<lock_scope>.migrate:<schema>.<table>` (so `t` and `public.t`
    /// serialise), then looks the table, each column of `add_columns`
    /// (`(name, type)`) and each index of `indexes` (`(suffix, "(cols) WHERE
    /// ..."`, named `<table>_<suffix>`) up in the catalog and runs `CREATE
    /// TABLE` / `ALTER TABLE ... ADD COLUMN` / `CREATE INDEX` only for what is
    /// missing. A migration that changes nothing therefore takes no lock on
    /// the table (`ALTER TABLE` takes ACCESS EXCLUSIVE and `CREATE INDEX`
    /// SHARE before they check `IF NOT EXISTS`, and would queue every insert
    /// behind an open transaction on the table). One that must change
    /// something waits at most [`MIGRATE_LOCK_TIMEOUT`] for the table's lock
    /// (`lock_timeout`, restored afterwards) and then fails with
    /// `lock_not_available` instead of holding every writer up.
    ///
    /// `create_columns` is the column list of `CREATE TABLE (...)`. All the
    /// inputs are the calling crate's constants (the names are validated).
    pub fn migration_sql(
        &self,
        lock_scope: &str,
        create_columns: &str,
        add_columns: &[(&str, &str)],
        indexes: &[(&str, &str)],
    ) -> String {
        let schema = match self.schema() {
            Some(s) => format!("'{s}'"),
            None => "current_schema()".to_string(),
        };
        let b = &self.base;
        let mut steps = String::new();
        for (col, ty) in add_columns {
            steps.push_str(&format!(
                "    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel \
                 AND attname = '{col}' AND attnum > 0 AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %I.%I ADD COLUMN IF NOT EXISTS \"{col}\" {ty}', s, t);
    END IF;
"
            ));
        }
        for (suffix, def) in indexes {
            steps.push_str(&format!(
                "    IF NOT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = s \
                 AND indexname = '{b}_{suffix}') THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS \"{b}_{suffix}\" ON %I.%I ', s, t) || $def${def}$def$;
    END IF;
"
            ));
        }
        format!(
            "DO $queue_migrate$
DECLARE
    s text := {schema};
    t constant text := '{b}';
    rel regclass;
    old_lock_timeout constant text := current_setting('lock_timeout');
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'cannot migrate table %: search_path names no existing schema', t;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('{lock_scope}.migrate:' || s || '.' || t));
    PERFORM set_config('lock_timeout', '{timeout}s', true);
    rel := to_regclass(format('%I.%I', s, t));
    IF rel IS NULL THEN
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (', s, t) || $cols${create_columns}$cols$ || ')';
        rel := to_regclass(format('%I.%I', s, t));
    END IF;
{steps}    PERFORM set_config('lock_timeout', old_lock_timeout, true);
END
$queue_migrate$;",
            timeout = MIGRATE_LOCK_TIMEOUT.as_secs(),
        )
    }

    /// The action an error of [`migration_sql`](Self::migration_sql) is
    /// reported under: says so when the table's lock was not granted in time.
    pub fn migrate_action(e: &tokio_postgres::Error) -> &'static str {
        if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
            "migrating the table (its lock was not granted within the migration's lock_timeout \
             of 5 s: a transaction on the table is open; nothing was changed, run it again \
             when it has ended)"
        } else {
            "migrating the table"
        }
    }

    pub(crate) fn migrate_sql(&self) -> String {
        self.migration_sql(
            "queue_outbox",
            "
    id             bigserial   PRIMARY KEY,
    job_id         text        NOT NULL CHECK (job_id <> ''),
    queue          text        NOT NULL CHECK (queue <> ''),
    job_type       text        NOT NULL,
    schema_version int         NOT NULL CHECK (schema_version >= 0),
    max_attempts   int         NOT NULL CHECK (max_attempts >= 1),
    payload        bytea       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz,
    rejected_at    timestamptz,
    attempts       int         NOT NULL DEFAULT 0,
    last_error     text,
    run_at         timestamptz,
    extra          text[],
    next_attempt_at timestamptz,
    UNIQUE (queue, job_id)
",
            &[("extra", "text[]"), ("next_attempt_at", "timestamptz")],
            &[
                (
                    "unpublished_idx",
                    "(id) WHERE published_at IS NULL AND rejected_at IS NULL",
                ),
                ("created_idx", "(created_at)"),
            ],
        )
    }

    /// The delay counts from the insert: `clock_timestamp()`, not `now()`
    /// (the start of the caller's transaction). Before, a job staged late
    /// in a long business transaction lost that part of its delay.
    pub(crate) fn insert_sql(&self) -> String {
        format!(
            "INSERT INTO {} (job_id, queue, job_type, schema_version, max_attempts, payload, run_at, extra) \
             VALUES ($1, $2, $3, $4, $5, $6, \
                     COALESCE($8::timestamptz, clock_timestamp() + $7::bigint * interval '1 microsecond'), $9) \
             ON CONFLICT (queue, job_id) DO NOTHING RETURNING id",
            self.quoted
        )
    }

    pub(crate) fn select_batch_sql(&self) -> String {
        format!(
            "SELECT {}, \
                    CASE WHEN isfinite(run_at) \
                         THEN GREATEST(0, ceil(extract(epoch FROM run_at - now()) * 1000))::bigint END, \
                    run_at IS NULL OR isfinite(run_at) \
             FROM {} WHERE published_at IS NULL AND rejected_at IS NULL \
                       AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
            Self::COLUMNS,
            self.quoted
        )
    }

    pub(crate) fn mark_published_sql(&self) -> String {
        format!(
            "UPDATE {} SET published_at = now(), attempts = attempts + 1 WHERE id = ANY($1)",
            self.quoted
        )
    }

    /// A row that met a failure of Redis itself: the whole relay backs off,
    /// and the row is first again when Redis is back (per-queue order kept).
    pub(crate) fn mark_failed_sql(&self) -> String {
        format!(
            "UPDATE {} SET attempts = attempts + 1, last_error = $2 WHERE id = $1",
            self.quoted
        )
    }

    /// A row Redis refused on its own: not selected again before
    /// `next_attempt_at`, 2^attempts seconds on (1 s, 2 s, 4 s, …; `attempts`
    /// is the count before this one), at most [`MAX_RETRY_SECS`].
    pub(crate) fn mark_deferred_sql(&self) -> String {
        format!(
            "UPDATE {} SET attempts = attempts + 1, last_error = $2, \
                 next_attempt_at = now() + least({MAX_RETRY_SECS}, \
                     power(2, least(greatest(attempts, 0), 30))) * interval '1 second' \
             WHERE id = $1",
            self.quoted
        )
    }

    pub(crate) fn mark_rejected_sql(&self) -> String {
        format!(
            "UPDATE {} SET attempts = attempts + 1, last_error = $2, rejected_at = now() WHERE id = $1",
            self.quoted
        )
    }

    /// A page of rows to reconcile, with the columns of
    /// [`RECONCILE_COLUMNS`](Self::RECONCILE_COLUMNS).
    pub(crate) fn reconcile_page_sql(&self) -> String {
        format!(
            "SELECT {} FROM {} WHERE id > $1 AND created_at < $2 AND created_at >= $3 ORDER BY id LIMIT $4",
            Self::RECONCILE_COLUMNS,
            self.quoted
        )
    }

    /// Columns read by reconciliation, in this order: not the payload (up to
    /// 512 MiB a row, never used there) nor the extra fields. Before, a
    /// page read 500 whole rows.
    pub(crate) const RECONCILE_COLUMNS: &'static str =
        "id, job_id, queue, job_type, created_at, published_at, rejected_at, attempts, \
         last_error, next_attempt_at";

    /// Deletes at most `$2` rows published before `$1`, oldest first.
    ///
    /// They are picked through the `created_at` index (a row is published
    /// after it is created, so `created_at < $1` keeps every row
    /// `published_at < $1` selects) into an array of ids, and deleted
    /// through the primary key. Before, `id IN (SELECT id .. LIMIT $2)` was
    /// planned as a hash semi join over a sequential scan: every 10 000-row
    /// chunk read the whole table.
    pub(crate) fn prune_sql(&self) -> String {
        format!(
            "DELETE FROM {t} WHERE id = ANY(ARRAY(\
                 SELECT id FROM {t} WHERE created_at < $1 AND published_at < $1 \
                 ORDER BY created_at LIMIT $2))",
            t = self.quoted
        )
    }

    pub(crate) fn stats_sql(&self) -> String {
        format!(
            "SELECT count(*) FILTER (WHERE published_at IS NULL AND rejected_at IS NULL), \
                    count(*) FILTER (WHERE rejected_at IS NOT NULL), \
                    count(*) FILTER (WHERE published_at IS NOT NULL), \
                    (extract(epoch FROM now() - min(created_at) \
                        FILTER (WHERE published_at IS NULL AND rejected_at IS NULL)))::float8 \
             FROM {}",
            self.quoted
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outbox;
    use queue_testkit::postgres::{self, DropTable};
    use std::time::{Duration, SystemTime};
    use tokio_postgres::Client;

    /// An outbox table of its own (dropped at the end) with `seed` run on it
    /// (`$T`: its quoted name) and then ANALYZEd, so that PostgreSQL plans
    /// as it would on a table of that size.
    struct Seeded {
        client: Client,
        outbox: Outbox,
        _guard: DropTable,
    }

    async fn seeded(seed: &str) -> Option<Seeded> {
        let url = postgres::require()?;
        let name = postgres::unique_name("outbox");
        let guard = DropTable::new(&url, &name);
        let client = crate::connect_postgres(&url).await.unwrap();
        let outbox = Outbox::with_table(&name).unwrap();
        outbox.migrate(&client).await.unwrap();
        let t = outbox.table_name().quoted();
        client
            .batch_execute(&format!("{}; ANALYZE {t}", seed.replace("$T", t)))
            .await
            .unwrap();
        Some(Seeded {
            client,
            outbox,
            _guard: guard,
        })
    }

    impl Seeded {
        /// PostgreSQL's plan of `sql` with `params`, one line per row.
        async fn explain(
            &self,
            sql: &str,
            params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
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
    }

    /// 25 000 rows created and published two days ago (three chunks),
    /// 40 000 published now, 500 unpublished and 500 rejected since two days.
    const PRUNE_SEED: &str = "
        INSERT INTO $T (job_id, queue, job_type, schema_version, max_attempts, payload, created_at, published_at)
            SELECT 'old-' || g, 'q', 't', 1, 1, '\\x00', now() - interval '2 days' + g * interval '1 ms',
                   now() - interval '2 days' + g * interval '1 ms' + interval '1 s'
            FROM generate_series(1, 25000) g;
        INSERT INTO $T (job_id, queue, job_type, schema_version, max_attempts, payload, created_at, published_at)
            SELECT 'new-' || g, 'q', 't', 1, 1, '\\x00', now(), now() FROM generate_series(1, 40000) g;
        INSERT INTO $T (job_id, queue, job_type, schema_version, max_attempts, payload, created_at, rejected_at)
            SELECT 'stuck-' || g, 'q', 't', 1, 1, '\\x00', now() - interval '2 days',
                   CASE WHEN g % 2 = 0 THEN now() - interval '2 days' END
            FROM generate_series(1, 1000) g;
    ";

    /// Regression: `id IN (SELECT id .. LIMIT n)` was planned as a hash semi
    /// join over a sequential scan, every 10 000-row chunk reading the whole
    /// table. The chunk must now be found through an index and deleted by
    /// primary key, and prune still delete exactly the rows published before
    /// the cutoff, over several chunks.
    #[tokio::test]
    async fn prune_deletes_old_published_rows_by_index_chunk_after_chunk() {
        let Some(t) = seeded(PRUNE_SEED).await else {
            return;
        };
        let cutoff = SystemTime::now() - Duration::from_secs(86_400);
        let plan = t
            .explain(&t.outbox.table_name().prune_sql(), &[&cutoff, &10_000_i64])
            .await;
        assert!(!plan.contains("Seq Scan"), "{plan}");

        let day = Duration::from_secs(86_400);
        assert_eq!(t.outbox.prune(&t.client, day).await.unwrap(), 25_000);
        let stats = t.outbox.stats(&t.client).await.unwrap();
        assert_eq!(
            (stats.published, stats.unpublished, stats.rejected),
            (40_000, 500, 500)
        );
    }

    #[test]
    fn accepts_plain_and_schema_qualified_names() {
        let t = TableName::parse("queue_outbox").unwrap();
        assert_eq!(t.quoted, "\"queue_outbox\"");
        assert_eq!(t.base, "queue_outbox");
        let t = TableName::parse("app.outbox_2").unwrap();
        assert_eq!(t.quoted, "\"app\".\"outbox_2\"");
        assert_eq!(t.base, "outbox_2");
        assert!(TableName::parse("_x").is_ok());
        assert!(
            TableName::parse("select").is_ok(),
            "quoted, so a keyword is fine"
        );
    }

    #[test]
    fn rejects_anything_that_is_not_a_plain_identifier() {
        for bad in [
            "",
            "Outbox",
            "1outbox",
            "out box",
            "outbox;drop table x",
            "out\"box",
            "a.b.c",
            ".outbox",
            "outbox.",
            "outbox-1",
            "ünïcode",
            &"x".repeat(MAX_IDENT_LEN + 1),
        ] {
            let err = TableName::parse(bad).unwrap_err();
            assert!(
                matches!(err, OutboxError::InvalidTableName { .. }),
                "{bad:?} -> {err}"
            );
        }
        assert!(TableName::parse(&"x".repeat(MAX_IDENT_LEN)).is_ok());
    }

    #[test]
    fn derived_index_names_fit_postgres_identifier_limit() {
        let t = TableName::parse(&"x".repeat(MAX_IDENT_LEN)).unwrap();
        assert!(format!("{}_unpublished_idx", t.base).len() <= 63);
    }
}
