-- Try to take the exclusive advisory lock of the name $1 (one 64-bit key) in this transaction,
-- without waiting: whether it was taken, and this session's process id.
SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)), pg_backend_pid()
