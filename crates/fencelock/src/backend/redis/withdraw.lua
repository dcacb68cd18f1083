-- fencelock Redis backend: a waiter gives up (queue.lua comes first).
--
-- KEYS[1]  "{prefix}lock:{name}"
-- KEYS[2]  "{prefix}queue:{name}"
-- KEYS[3]  "{prefix}holder:{name}"
-- KEYS[4]  "{prefix}holders:{name}" the shared holders (see queue.lua)
-- KEYS[5]  "{prefix}tokens:{name}"
-- ARGV[2]  the waiter's ticket
-- ARGV[3]  the election channel "{prefix}leader:{name}"
--
-- Takes the ticket off the queue with its waiter and wake keys. If the lock
-- was granted to this ticket by an attempt whose answer never reached the
-- caller (the acquire was dropped in flight), deletes it (with its holder
-- key, publishing "r{token}" on the election channel), and a shared grant
-- likewise (off the shared holders). If the caller was
-- first in line, or held the lock, and the lock is now free, passes the wake
-- on to the next live waiter.
-- Returns 1 if a lock granted to the ticket was deleted, else 0.

local lock, queue, ticket = KEYS[1], KEYS[2], ARGV[2]
local was_head = redis.call('LINDEX', queue, 0) == ticket
redis.call('LREM', queue, 0, ticket)
redis.call('DEL', waiter_key(ticket), wake_key(ticket))
local withdrew = 0
local holder = redis.call('GET', lock)
if holder and string.sub(holder, -#ticket - 1) == ':' .. ticket then
  redis.call('DEL', lock, KEYS[3])
  -- pcall: a user without the channel in its ACL still locks, unannounced.
  redis.pcall('PUBLISH', ARGV[3], 'r' .. string.match(holder, '^(%d+):'))
  holder = false
  withdrew = 1
end
if redis.call('ZREM', KEYS[4], ticket) == 1 then
  redis.call('HDEL', KEYS[5], ticket)
  withdrew = 1
end
if not holder and (was_head or withdrew == 1) then wake_head(queue) end
return withdrew
