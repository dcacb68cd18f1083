-- The holder's process id and the number of waiters of $1's key, from pg_locks (a one-key
-- advisory lock shows its key's high and low 32 bits as classid and objid, with objsubid 1).
WITH k AS (SELECT ((h >> 32) & 4294967295)::oid AS hi, (h & 4294967295)::oid AS lo
           FROM (SELECT hashtextextended($1, 0) AS h) x),
l AS (SELECT pid, granted FROM pg_locks, k
      WHERE locktype = 'advisory' AND classid = k.hi AND objid = k.lo AND objsubid = 1
        AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
SELECT (SELECT pid FROM l WHERE granted LIMIT 1), (SELECT count(*) FROM l WHERE NOT granted)
