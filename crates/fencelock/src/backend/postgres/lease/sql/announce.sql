-- Tell the observers of $1 that its holder or value changed: NOTIFY on channel $2 (the table name)
-- with '0:name' (queue ids start at 1, so it names no waiter).
SELECT set_config('synchronous_commit', 'off', true), pg_notify($2, '0:' || $1)
