//! The table layout and the statements of the lease-table mode (see the
//! [module docs](super)), one `.sql` file each in `sql/` beside this file,
//! loaded with `include_str!`. The files write the table as `{table}`;
//! [`Table::render`] puts in the name that [`Table::new`] checked at connect
//! (a plain lower-case identifier, so it cannot end the quotes it stands in).
//! Every other value is a bound parameter (`$1`, …).
//!
//! Where it sits: under [`super::LeaseMode`], which builds one [`Sql`] per
//! table at connect and creates the schema if it is missing.

use tokio_postgres::types::{ToSql, Type};

use super::super::{bounded, Table, STATEMENT_TIMEOUT};
use super::conn::Db;
use super::shared;
use super::store::{column, one};
use crate::error::Error;

/// The statements, with the table name put in (see the module docs).
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

impl Sql {
    pub(super) fn new(table: &Table) -> Sql {
        Sql {
            attempt: table.render(include_str!("sql/attempt.sql")),
            enqueue: table.render(include_str!("sql/enqueue.sql")),
            withdraw: table.render(include_str!("sql/withdraw.sql")),
            wake: table.render(include_str!("sql/wake.sql")),
            renew: table.render(include_str!("sql/renew.sql")),
            release: table.render(include_str!("sql/release.sql")),
            check: table.render(include_str!("sql/check.sql")),
            set_value: table.render(include_str!("sql/set_value.sql")),
            leader: table.render(include_str!("sql/leader.sql")),
            // No table: the channel (the table name) is the bound `$2`.
            announce: include_str!("sql/announce.sql").to_string(),
            shared: shared::SharedSql::new(table),
        }
    }
}

/// The DDL of the module docs, for `table`: `sql/schema.sql` (which opens
/// the transaction), the additions of read-write locks and semaphores, and
/// the commit.
fn schema_sql(table: &Table) -> String {
    let lease = table.render(include_str!("sql/schema.sql"));
    format!("{lease}\n{}\nCOMMIT", shared::schema_sql(table))
}

/// Creates the schema unless all of it exists already.
pub(super) async fn ensure_schema(db: &Db, table: &Table) -> Result<(), Error> {
    let by = crate::clock::now() + STATEMENT_TIMEOUT;
    let names =
        ["", "_token_seq", "_waiters", "_holders", "_shared"].map(|suffix| format!("\"{}{suffix}\"", table.as_str()));
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
        let table = Table::new("t_1").unwrap();
        let sql = Sql::new(&table);
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
            assert!(!stmt.contains("fencelock_locks") && !stmt.contains('{'), "{stmt}");
        }
        assert!(sql.attempt.contains("nextval('\"t_1_token_seq\"')"));
        assert!(sql.shared.attempt.contains("\"t_1_share\"(") && sql.shared.tokens.contains("\"t_1_shared\""));
        assert!(shared::schema_sql(&table).contains("nextval('\"t_1_token_seq\"')"));
        let ddl = schema_sql(&table);
        assert!(ddl.contains("\nBEGIN;\n") && ddl.ends_with("\nCOMMIT"), "{ddl}");
        assert!(!ddl.contains("{table}"), "{ddl}");
    }
}
