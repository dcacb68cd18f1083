-- Wake the oldest live waiter of $1, if any: NOTIFY on channel $2 (the table name) with 'id:name'.
-- Sent after the change committed; its own commit need not wait for the disk.
SELECT set_config('synchronous_commit', 'off', true), pg_notify($2, id::text || ':' || $1)
FROM (SELECT min(id) AS id FROM "{table}_waiters" WHERE name = $1 AND expires_at > clock_timestamp()) head
WHERE id IS NOT NULL
