-- fencelock Redis backend: release of a shared grant, a reader's or a
-- semaphore's permits (queue.lua comes first).
--
-- KEYS[1]  "{prefix}lock:{name}"
-- KEYS[2]  "{prefix}queue:{name}"
-- KEYS[3]  "{prefix}holders:{name}"
-- KEYS[4]  "{prefix}tokens:{name}"
-- KEYS[5]  "{prefix}permits:{name}"
-- ARGV[2]  the holder's ticket
--
-- Compare-and-delete: takes the ticket off the holders if it is there and
-- has not expired. A semaphore left without holders or waiters forgets its
-- N. Then, if no exclusive holder holds, wakes the first live waiter (only
-- it). Returns 1 if this call released the grant, else 0.

local lock, queue, holders, tokens, permits_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ticket = ARGV[2]
local now = now_ms()
local released = 0
local expiry = redis.call('ZSCORE', holders, ticket)
if expiry and tonumber(expiry) > now then released = 1 end
redis.call('ZREM', holders, ticket)
redis.call('HDEL', tokens, ticket)
purge_shared(holders, tokens, now)
if redis.call('ZCARD', holders) == 0 and redis.call('LLEN', queue) == 0 then
  redis.call('DEL', permits_key)
end
if redis.call('EXISTS', lock) == 0 then wake_head(queue) end
return released
