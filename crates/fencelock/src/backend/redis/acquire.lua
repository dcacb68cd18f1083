-- fencelock Redis backend: one attempt to take a lock (queue.lua comes first).
--
-- KEYS[1]  "{prefix}lock:{name}"   the lock: "{token}:{ticket}" with PX ttl
-- KEYS[2]  "{prefix}queue:{name}"  the waiters' tickets in arrival order
-- KEYS[3]  "{prefix}token"         the global token counter
-- KEYS[4]  "{prefix}holder:{name}" the holder's "{token}:{identity and value}", PX ttl
-- ARGV[2]  the caller's ticket (32 hex digits)
-- ARGV[3]  the TTL in ms (of the lock, and of the waiter's liveness key)
-- ARGV[4]  "1" to wait (enqueue the ticket if not granted), "0" to try once
-- ARGV[5]  the caller's identity and value, encoded (may be empty)
-- ARGV[6]  the election channel "{prefix}leader:{name}"
-- ARGV[7]  "1" if the ticket was queued before and must not be queued again
--          (a campaign's: a candidate that lost its place is told, not requeued)
--
-- Grants iff the lock is free and nobody live waits ahead of the caller (the
-- queue is empty or the caller's ticket is its head): INCR the counter, SET
-- the lock with PX, take the ticket off the queue. Dead tickets at the head
-- are dropped first; if that leaves the lock free with another live waiter
-- first in line, that waiter is woken (the wake may have gone to a dead one).
-- A grant publishes "g{token}:{identity and value}" on the election channel.
-- Returns {1, token}: granted (also when this ticket holds the lock already:
--                     a retried attempt whose first answer was lost);
--         {2}: ARGV[7] is "1" and the ticket is no longer queued (its waiter
--              key expired and it was dropped); nothing changed;
--         {0, holder's value or '', lock PTTL (-2: free), waiters, 1 if
--          the caller is first in line else 0}: not granted.

local lock, queue, counter, holder_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ticket, ttl, wait = ARGV[2], ARGV[3], ARGV[4] == '1'
local data, channel, queued_before = ARGV[5], ARGV[6], ARGV[7] == '1'

local holder = redis.call('GET', lock)
if holder and string.sub(holder, -#ticket - 1) == ':' .. ticket then
  redis.call('PEXPIRE', lock, ttl)
  redis.call('PEXPIRE', holder_key, ttl)
  return {1, string.match(holder, '^(%d+):')}
end

local head, dropped = live_head(queue, ticket)
if queued_before and head ~= ticket and not redis.call('LPOS', queue, ticket) then
  return {2}
end
if not holder and (not head or head == ticket) then
  redis.call('INCR', counter)
  local token = redis.call('GET', counter)
  redis.call('SET', lock, token .. ':' .. ticket, 'PX', ttl)
  redis.call('SET', holder_key, token .. ':' .. data, 'PX', ttl)
  -- pcall: a user without the channel in its ACL still locks, unannounced.
  redis.pcall('PUBLISH', channel, 'g' .. token .. ':' .. data)
  if head == ticket then redis.call('LPOP', queue) end
  redis.call('DEL', waiter_key(ticket), wake_key(ticket))
  return {1, token}
end

-- A dead waiter may have taken the wake meant for the next one: pass it on.
if dropped and not holder and head then wake(head) end

if wait then
  if not redis.call('LPOS', queue, ticket) then
    redis.call('RPUSH', queue, ticket)
  end
  redis.call('SET', waiter_key(ticket), ttl, 'PX', ttl)
  if not head then head = ticket end
end
local first = 0
if head == ticket then first = 1 end
return {0, holder or '', redis.call('PTTL', lock), redis.call('LLEN', queue), first}
