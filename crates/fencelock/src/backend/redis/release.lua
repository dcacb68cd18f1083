-- fencelock Redis backend: release (queue.lua comes first).
--
-- KEYS[1]  "{prefix}lock:{name}"
-- KEYS[2]  "{prefix}queue:{name}"
-- KEYS[3]  "{prefix}holder:{name}"
-- ARGV[2]  the holder's value "{token}:{ticket}"
-- ARGV[3]  the election channel "{prefix}leader:{name}"
--
-- Compare-and-delete: deletes the lock (and its holder key) only if it still
-- holds ARGV[2], and publishes "r{token}" on the election channel. Then,
-- if the lock is free, wakes the first live waiter (only it).
-- Returns 1 if this call deleted the lock, else 0.

local released = 0
if redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1], KEYS[3])
  -- pcall: a user without the channel in its ACL still locks, unannounced.
  redis.pcall('PUBLISH', ARGV[3], 'r' .. string.match(ARGV[2], '^(%d+):'))
  released = 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then wake_head(KEYS[2]) end
return released
