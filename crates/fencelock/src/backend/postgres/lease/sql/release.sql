-- Release: compare-and-delete (and sweep expired waiters). $1 name, $2 token, $3 owner. 1 if released.
WITH released AS (
    UPDATE "{table}" SET owner = NULL, expires_at = NULL
    WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() RETURNING 1
), swept AS (
    DELETE FROM "{table}_waiters" WHERE name = $1 AND expires_at <= clock_timestamp()
)
SELECT count(*) FROM released
