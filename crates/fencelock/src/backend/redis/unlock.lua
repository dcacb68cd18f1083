-- fencelock Redlock backend: compare-and-delete on one node.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the holder's value
--
-- Returns 1 if the lock held ARGV[1] and was deleted, else 0.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
