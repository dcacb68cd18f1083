-- Enqueue a request (dropping any earlier entry of it): its queue id.
-- $1 name, $2 owner, $3 TTL in µs, $4 kind (x, r, s), $5 weight, $6 permits.
WITH earlier AS (DELETE FROM "{table}_waiters" WHERE name = $1 AND owner = $2)
INSERT INTO "{table}_waiters" (name, owner, expires_at, kind, weight, permits)
VALUES ($1, $2, clock_timestamp() + $3 * interval '1 microsecond', $4, $5, $6) RETURNING id
