-- fencelock Redis backend: renew a shared grant (queue.lua comes first).
--
-- KEYS[1]  "{prefix}holders:{name}"
-- KEYS[2]  "{prefix}tokens:{name}"
-- KEYS[3]  "{prefix}permits:{name}"
-- ARGV[2]  the holder's ticket
-- ARGV[3]  the TTL in ms
--
-- Returns 1 and moves the ticket's expiry to now + TTL if it still holds
-- (present and not expired); else 0 and changes nothing.

local holders, tokens, permits_key = KEYS[1], KEYS[2], KEYS[3]
local ticket, ttl = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local expiry = redis.call('ZSCORE', holders, ticket)
if not expiry or tonumber(expiry) <= now then return 0 end
redis.call('ZADD', holders, 'XX', now + ttl, ticket)
extend(holders, now + ttl)
extend(tokens, now + ttl)
if redis.call('EXISTS', permits_key) == 1 then extend(permits_key, now + ttl) end
return 1
