-- Renew a grant: $1 name, $2 token, $3 owner, $4 TTL in µs. No row: the lock is no longer ours.
UPDATE "{table}" SET expires_at = clock_timestamp() + $4 * interval '1 microsecond'
WHERE name = $1 AND token = $2 AND owner = $3 AND expires_at > clock_timestamp() RETURNING 1
