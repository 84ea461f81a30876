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

    /// Columns read by the relay and by reconciliation, in this order.
    pub(crate) const COLUMNS: &'static str =
        "id, job_id, queue, job_type, schema_version, max_attempts, payload, \
         created_at, published_at, rejected_at, attempts, last_error, run_at, extra, \
         next_attempt_at";

    pub(crate) fn migrate_sql(&self) -> String {
        let t = &self.quoted;
        let b = &self.base;
        // One simple-query batch runs as one implicit transaction (or inside the
        // caller's), so the advisory lock serialises concurrent migrations
        // (CREATE TABLE IF NOT EXISTS alone can race on the catalog).
        format!(
            "SELECT pg_advisory_xact_lock(hashtext('queue_outbox.migrate:{name}'));
CREATE TABLE IF NOT EXISTS {t} (
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
);
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS extra text[];
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz;
CREATE INDEX IF NOT EXISTS \"{b}_unpublished_idx\" ON {t} (id)
    WHERE published_at IS NULL AND rejected_at IS NULL;
CREATE INDEX IF NOT EXISTS \"{b}_created_idx\" ON {t} (created_at);",
            name = self.name,
        )
    }

    pub(crate) fn insert_sql(&self) -> String {
        format!(
            "INSERT INTO {} (job_id, queue, job_type, schema_version, max_attempts, payload, run_at, extra) \
             VALUES ($1, $2, $3, $4, $5, $6, \
                     COALESCE($8::timestamptz, now() + $7::bigint * interval '1 microsecond'), $9) \
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

    pub(crate) fn reconcile_page_sql(&self) -> String {
        format!(
            "SELECT {} FROM {} WHERE id > $1 AND created_at < $2 AND created_at >= $3 ORDER BY id LIMIT $4",
            Self::COLUMNS,
            self.quoted
        )
    }

    pub(crate) fn prune_sql(&self) -> String {
        format!(
            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE published_at < $1 LIMIT $2)",
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
