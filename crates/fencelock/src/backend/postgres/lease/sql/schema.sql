-- Schema of the lease tables (the module docs of lease.rs), created in one transaction
-- holding a two-key advisory lock; schema_shared.sql follows, then COMMIT.
BEGIN;
SELECT pg_advisory_xact_lock(1718382435, hashtext('{table}'));
CREATE TABLE IF NOT EXISTS "{table}" (
    name text PRIMARY KEY, token bigint, owner text, expires_at timestamptz);
CREATE SEQUENCE IF NOT EXISTS "{table}_token_seq" AS bigint;
CREATE TABLE IF NOT EXISTS "{table}_waiters" (
    id bigserial PRIMARY KEY, name text NOT NULL, owner text NOT NULL, expires_at timestamptz NOT NULL);
CREATE INDEX IF NOT EXISTS "{table}_waiters_name" ON "{table}_waiters" (name, id);
CREATE TABLE IF NOT EXISTS "{table}_holders" (
    name text PRIMARY KEY, token bigint NOT NULL, identity text, value bytea NOT NULL);
