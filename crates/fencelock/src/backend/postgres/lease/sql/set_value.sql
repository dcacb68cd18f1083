-- New value: compare-and-set of the holders row if the grant is still live.
-- $1 name, $2 token, $3 owner, $4 identity, $5 value. No row: not ours any more.
WITH mine AS (
    SELECT name, token FROM "{table}"
    WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() FOR UPDATE
)
INSERT INTO "{table}_holders" (name, token, identity, value) SELECT name, token, $4, $5 FROM mine
ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token, identity = EXCLUDED.identity,
    value = EXCLUDED.value WHERE "{table}_holders".token <= EXCLUDED.token RETURNING 1
