-- fencelock Redis and Redlock backends: renew a held lock.
--
-- KEYS[1]  the lock key
-- KEYS[2]  (Redis only) the holder key, renewed with the lock
-- ARGV[1]  the holder's value
-- ARGV[2]  the TTL in ms
--
-- Returns 1 and sets the lock's expiry to the TTL if the lock still holds
-- ARGV[1]; else 0 and changes nothing (the lock is not ours any more).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if KEYS[2] then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
  return 1
end
return 0
