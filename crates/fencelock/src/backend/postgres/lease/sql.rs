//! The table layout and the statements of the lease-table mode (see the
//! [module docs](super)): the table name, checked at connect, is the only
//! thing spliced into them.
//!
//! Where it sits: under [`super::LeaseMode`], which builds one [`Sql`] per
//! table at connect and creates the schema if it is missing.

use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};

use super::super::{bounded, STATEMENT_TIMEOUT};
use super::conn::Db;
use super::shared;
use super::store::{column, one};
use crate::error::Error;

/// The statements, with the table name spliced in (see the module docs).
pub(super) struct Sql {
    pub(super) attempt: String,
    pub(super) enqueue: String,
    pub(super) withdraw: String,
    pub(super) wake: String,
    pub(super) renew: String,
    pub(super) release: String,
    pub(super) check: String,
    pub(super) set_value: String,
    pub(super) leader: String,
    pub(super) announce: String,
    pub(super) shared: shared::SharedSql,
}

/// `x - clock_timestamp()` in whole microseconds (rounded up, at least 0).
fn left_us(x: &str) -> String {
    format!("greatest(0, ceil(extract(epoch FROM {x} - clock_timestamp()) * 1000000))::bigint")
}

impl Sql {
    pub(super) fn new(table: &str) -> Sql {
        let locks = format!("\"{table}\"");
        let waiters = format!("\"{table}_waiters\"");
        let holders = format!("\"{table}_holders\"");
        let shared = format!("\"{table}_shared\"");
        let seq = format!("'\"{table}_token_seq\"'");
        let expiry = "clock_timestamp() + $3 * interval '1 microsecond'";
        let attempt = format!(
            "WITH ahead AS (\
                SELECT count(*) AS n, min(expires_at) AS first_expiry FROM {waiters} \
                WHERE name = $1 AND id < $4 AND expires_at > clock_timestamp()\
            ), cur AS (\
                SELECT token, owner IS NOT NULL AND expires_at > clock_timestamp() AS held, expires_at, shared_until \
                FROM {locks} WHERE name = $1\
            ), created AS (\
                INSERT INTO {locks} (name, token, owner, expires_at) \
                SELECT $1, nextval({seq}), $2, {expiry} \
                WHERE NOT EXISTS (SELECT 1 FROM cur) AND (SELECT n FROM ahead) = 0 \
                ON CONFLICT (name) DO NOTHING RETURNING token\
            ), taken AS (\
                UPDATE {locks} SET token = nextval({seq}), owner = $2, expires_at = {expiry} \
                WHERE name = $1 AND ((owner IS NULL OR expires_at <= clock_timestamp()) AND (SELECT n FROM ahead) = 0 \
                    AND (shared_until IS NULL OR shared_until <= clock_timestamp()) \
                    OR owner = $2 AND expires_at > clock_timestamp()) \
                RETURNING token\
            ), granted AS (\
                SELECT token FROM created UNION ALL SELECT token FROM taken\
            ), described AS (\
                INSERT INTO {holders} (name, token, identity, value) \
                SELECT $1, token, $5, $6 FROM granted WHERE $5 IS NOT NULL OR length($6) > 0 \
                {upsert}\
            ), dequeued AS (\
                DELETE FROM {waiters} WHERE id = $4 AND EXISTS (SELECT 1 FROM granted)\
            ), refreshed AS (\
                UPDATE {waiters} SET expires_at = {expiry} \
                WHERE id = $4 AND expires_at > clock_timestamp() AND NOT EXISTS (SELECT 1 FROM granted) \
                RETURNING id\
            ) \
            SELECT (SELECT token FROM granted), \
                (SELECT token FROM cur WHERE held), \
                (SELECT CASE WHEN held THEN {holder_left} \
                    WHEN shared_until > clock_timestamp() THEN {shared_left} END FROM cur), \
                (SELECT n FROM ahead), \
                (SELECT CASE WHEN n > 0 THEN {ahead_left} END FROM ahead), \
                (SELECT count(*) FROM {waiters} WHERE name = $1 AND expires_at > clock_timestamp()), \
                EXISTS (SELECT 1 FROM refreshed), NULL::int",
            holder_left = left_us("expires_at"),
            shared_left = left_us("shared_until"),
            ahead_left = left_us("first_expiry"),
            upsert = upsert(&holders),
        );
        let enqueue = format!(
            "WITH earlier AS (DELETE FROM {waiters} WHERE name = $1 AND owner = $2) \
             INSERT INTO {waiters} (name, owner, expires_at, kind, weight, permits) \
             VALUES ($1, $2, {expiry}, $4, $5, $6) RETURNING id"
        );
        let withdraw = format!(
            "WITH gone AS (DELETE FROM {waiters} WHERE name = $1 AND owner = $2 RETURNING id), \
             freed AS (UPDATE {locks} SET owner = NULL, expires_at = NULL WHERE name = $1 AND owner = $2 RETURNING 1), \
             unshared AS (DELETE FROM {shared} WHERE name = $1 AND owner = $2 RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM freed) OR EXISTS (SELECT 1 FROM unshared) OR EXISTS (SELECT 1 FROM gone WHERE NOT EXISTS (\
                 SELECT 1 FROM {waiters} w WHERE w.name = $1 AND w.id < gone.id AND w.expires_at > clock_timestamp()))"
        );
        let wake = format!(
            "SELECT set_config('synchronous_commit', 'off', true), pg_notify($2, id::text || ':' || $1) \
             FROM (SELECT min(id) AS id FROM {waiters} WHERE name = $1 AND expires_at > clock_timestamp()) head \
             WHERE id IS NOT NULL"
        );
        let renew = format!(
            "UPDATE {locks} SET expires_at = clock_timestamp() + $4 * interval '1 microsecond' \
             WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() RETURNING 1"
        );
        let release = format!(
            "WITH released AS (\
                UPDATE {locks} SET owner = NULL, expires_at = NULL \
                WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() RETURNING 1\
            ), swept AS (\
                DELETE FROM {waiters} WHERE name = $1 AND expires_at <= clock_timestamp()\
            ) \
            SELECT count(*) FROM released"
        );
        let check =
            format!("SELECT token, owner IS NOT NULL AND expires_at > clock_timestamp() FROM {locks} WHERE name = $1");
        let set_value = format!(
            "WITH mine AS (\
                SELECT name, token FROM {locks} \
                WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() FOR UPDATE\
            ) \
            INSERT INTO {holders} (name, token, identity, value) SELECT name, token, $4, $5 FROM mine \
            {upsert} RETURNING 1",
            upsert = upsert(&holders),
        );
        let leader = format!(
            "SELECT l.token, h.identity, h.value, {left} \
             FROM {locks} l LEFT JOIN {holders} h ON h.name = l.name AND h.token = l.token \
             WHERE l.name = $1 AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()",
            left = left_us("l.expires_at"),
        );
        let announce = "SELECT set_config('synchronous_commit', 'off', true), pg_notify($2, '0:' || $1)".to_string();
        let shared = shared::SharedSql::new(table);
        Sql { attempt, enqueue, withdraw, wake, renew, release, check, set_value, leader, announce, shared }
    }
}

/// The upsert of a holders row: a row of an older grant is replaced, never
/// one of a newer grant.
fn upsert(holders: &str) -> String {
    format!(
        "ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, identity = EXCLUDED.identity, \
         value = EXCLUDED.value WHERE {holders}.token <= EXCLUDED.token"
    )
}

/// The DDL of the module docs, for `table`.
fn schema_sql(table: &str) -> String {
    format!(
        "BEGIN; \
         SELECT pg_advisory_xact_lock(1718382435, hashtext('{table}')); \
         CREATE TABLE IF NOT EXISTS \"{table}\" (\
             name text PRIMARY KEY, token bigint, owner text, expires_at timestamptz); \
         CREATE SEQUENCE IF NOT EXISTS \"{table}_token_seq\" AS bigint; \
         CREATE TABLE IF NOT EXISTS \"{table}_waiters\" (\
             id bigserial PRIMARY KEY, name text NOT NULL, owner text NOT NULL, expires_at timestamptz NOT NULL); \
         CREATE INDEX IF NOT EXISTS \"{table}_waiters_name\" ON \"{table}_waiters\" (name, id); \
         CREATE TABLE IF NOT EXISTS \"{table}_holders\" (\
             name text PRIMARY KEY, token bigint NOT NULL, identity text, value bytea NOT NULL); \
         {shared} \
         COMMIT",
        shared = shared::schema_sql(table),
    )
}

/// Creates the schema unless all of it exists already.
pub(super) async fn ensure_schema(db: &Db, table: &str) -> Result<(), Error> {
    let by = Instant::now() + STATEMENT_TIMEOUT;
    let names = ["", "_token_seq", "_waiters", "_holders", "_shared"].map(|suffix| format!("\"{table}{suffix}\""));
    let [a, b, c, d, e] = &names;
    // The shared table comes with the functions, in the same transaction.
    let sql = "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL \
               AND to_regclass($4) IS NOT NULL AND to_regclass($5) IS NOT NULL";
    let params: [(&(dyn ToSql + Sync), Type); 5] =
        [(a, Type::TEXT), (b, Type::TEXT), (c, Type::TEXT), (d, Type::TEXT), (e, Type::TEXT)];
    let rows = db.query("schema check", sql, &params, by).await?;
    if column::<bool>(one(&rows, "schema check")?, 0)? {
        return Ok(());
    }
    let conn = db.conn(by).await?;
    if let Err(e) = bounded("creating the schema", by, conn.client.batch_execute(&schema_sql(table))).await {
        // Leave the shared connection outside the failed transaction.
        let _ = bounded("rollback", by, conn.client.batch_execute("ROLLBACK")).await;
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_name_is_the_only_thing_spliced_in() {
        let sql = Sql::new("t_1");
        for stmt in [
            &sql.attempt,
            &sql.enqueue,
            &sql.withdraw,
            &sql.wake,
            &sql.renew,
            &sql.release,
            &sql.check,
            &sql.set_value,
            &sql.leader,
        ] {
            assert!(stmt.contains("\"t_1"), "{stmt}");
            assert!(!stmt.contains("fencelock_locks"), "{stmt}");
        }
        assert!(sql.attempt.contains("nextval('\"t_1_token_seq\"')"));
        assert!(sql.shared.attempt.contains("\"t_1_share\"(") && sql.shared.tokens.contains("\"t_1_shared\""));
        assert!(shared::schema_sql("t_1").contains("nextval('\"t_1_token_seq\"')"));
    }
}
