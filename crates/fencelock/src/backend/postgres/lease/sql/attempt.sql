-- One grant attempt (see the module docs of lease.rs: "Grant: one statement").
-- $1 name, $2 owner, $3 TTL in µs, $4 queue id (or i64::MAX: not queued), $5 identity, $6 value.
-- Answers: granted token, holder's token, holder's time left (µs), waiters ahead, time until the first
-- of them expires (µs), live waiters, whether the request's queue entry is live, NULL (no mismatch).
WITH ahead AS (
    SELECT count(*) AS n, min(expires_at) AS first_expiry FROM "{table}_waiters"
    WHERE name = $1 AND id < $4 AND expires_at > clock_timestamp()
), cur AS (
    SELECT token, owner IS NOT NULL AND expires_at > clock_timestamp() AS held, expires_at, shared_until
    FROM "{table}" WHERE name = $1
), created AS (
    INSERT INTO "{table}" (name, token, owner, expires_at)
    SELECT $1, nextval('"{table}_token_seq"'), $2, clock_timestamp() + $3 * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT 1 FROM cur) AND (SELECT n FROM ahead) = 0
    ON CONFLICT (name) DO NOTHING RETURNING token
), taken AS (
    UPDATE "{table}" SET token = nextval('"{table}_token_seq"'), owner = $2, expires_at = clock_timestamp() + $3 * interval '1 microsecond'
    WHERE name = $1 AND ((owner IS NULL OR expires_at <= clock_timestamp()) AND (SELECT n FROM ahead) = 0
        AND (shared_until IS NULL OR shared_until <= clock_timestamp())
        OR owner = $2 AND expires_at > clock_timestamp())
    RETURNING token
), granted AS (
    SELECT token FROM created UNION ALL SELECT token FROM taken
), described AS (
    INSERT INTO "{table}_holders" (name, token, identity, value)
    SELECT $1, token, $5, $6 FROM granted WHERE $5 IS NOT NULL OR length($6) > 0
    ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, identity = EXCLUDED.identity,
    value = EXCLUDED.value WHERE "{table}_holders".token <= EXCLUDED.token
), dequeued AS (
    DELETE FROM "{table}_waiters" WHERE id = $4 AND EXISTS (SELECT 1 FROM granted)
), refreshed AS (
    UPDATE "{table}_waiters" SET expires_at = clock_timestamp() + $3 * interval '1 microsecond'
    WHERE id = $4 AND expires_at > clock_timestamp() AND NOT EXISTS (SELECT 1 FROM granted)
    RETURNING id
)
SELECT (SELECT token FROM granted),
    (SELECT token FROM cur WHERE held),
    (SELECT CASE WHEN held THEN greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000000))::bigint
        WHEN shared_until > clock_timestamp() THEN greatest(0, ceil(extract(epoch FROM shared_until - clock_timestamp()) * 1000000))::bigint END FROM cur),
    (SELECT n FROM ahead),
    (SELECT CASE WHEN n > 0 THEN greatest(0, ceil(extract(epoch FROM first_expiry - clock_timestamp()) * 1000000))::bigint END FROM ahead),
    (SELECT count(*) FROM "{table}_waiters" WHERE name = $1 AND expires_at > clock_timestamp()),
    EXISTS (SELECT 1 FROM refreshed), NULL::int
