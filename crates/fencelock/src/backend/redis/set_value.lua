-- fencelock Redis backend: replace the value a held lock published.
--
-- KEYS[1]  "{prefix}lock:{name}"
-- KEYS[2]  "{prefix}holder:{name}"
-- ARGV[1]  the holder's value "{token}:{ticket}"
-- ARGV[2]  the new identity and value (data)
-- ARGV[3]  the election channel "{prefix}leader:{name}"
--
-- Compare-and-set: only if the lock still holds ARGV[1], sets the holder key
-- to "{token}:{data}" with the lock's remaining TTL and publishes
-- "g{token}:{data}" on the election channel (observers take a grant of the
-- term they know as its new value). Returns 1 if it did, else 0 (nothing
-- changed). Idempotent.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local token = string.match(ARGV[1], '^(%d+):')
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('SET', KEYS[2], token .. ':' .. ARGV[2], 'PX', ttl)
else
  -- The lock has no expiry (set by hand): neither has its holder key.
  redis.call('SET', KEYS[2], token .. ':' .. ARGV[2])
end
-- pcall: a user without the channel in its ACL still sets, unannounced.
redis.pcall('PUBLISH', ARGV[3], 'g' .. token .. ':' .. ARGV[2])
return 1
