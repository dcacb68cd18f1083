-- Withdraw a request: its queue entry, a grant it never received, a shared grant.
-- $1 name, $2 owner. True if the next waiter should be woken.
WITH gone AS (DELETE FROM "{table}_waiters" WHERE name = $1 AND owner = $2 RETURNING id),
freed AS (UPDATE "{table}" SET owner = NULL, expires_at = NULL WHERE name = $1 AND owner = $2 RETURNING 1),
unshared AS (DELETE FROM "{table}_shared" WHERE name = $1 AND owner = $2 RETURNING 1)
SELECT EXISTS (SELECT 1 FROM freed) OR EXISTS (SELECT 1 FROM unshared) OR EXISTS (SELECT 1 FROM gone WHERE NOT EXISTS (
    SELECT 1 FROM "{table}_waiters" w WHERE w.name = $1 AND w.id < gone.id AND w.expires_at > clock_timestamp()))
