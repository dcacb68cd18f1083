-- Wait for the advisory lock of the name $1 shared (a reader), as lock.sql.
SELECT pg_backend_pid(), pg_advisory_xact_lock_shared(hashtextextended($1, 0))
