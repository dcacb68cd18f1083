-- Wait for the exclusive advisory lock of the name $1 (bounded by the session's lock_timeout:
-- 55P03 when it runs out); the process id comes first, so it is known while waiting.
SELECT pg_backend_pid(), pg_advisory_xact_lock(hashtextextended($1, 0))
