-- Try to take the advisory lock of the name $1 shared (a reader), without waiting:
-- whether it was taken, and this session's process id.
SELECT pg_try_advisory_xact_lock_shared(hashtextextended($1, 0)), pg_backend_pid()
