-- fencelock Redis backend: one attempt to take a lock, a read lock or a
-- semaphore's permits (queue.lua comes first).
--
-- KEYS[1]  "{prefix}lock:{name}"   the exclusive holder: "{token}:{ticket}" with PX ttl
-- KEYS[2]  "{prefix}queue:{name}"  the waiters' tickets in arrival order
-- KEYS[3]  "{prefix}token"         the global token counter
-- KEYS[4]  "{prefix}holder:{name}" the holder's "{token}:{identity and value}", PX ttl
-- KEYS[5]  "{prefix}holders:{name}" the shared holders (see queue.lua)
-- KEYS[6]  "{prefix}tokens:{name}"  their tokens
-- KEYS[7]  "{prefix}permits:{name}" a semaphore's N
-- ARGV[2]  the caller's ticket (32 hex digits, then its kind: see queue.lua)
-- ARGV[3]  the TTL in ms (of the grant, and of the waiter's liveness key)
-- ARGV[4]  "1" to wait (enqueue the ticket if not granted), "0" to try once
-- ARGV[5]  the caller's identity and value, encoded (may be empty)
-- ARGV[6]  the election channel "{prefix}leader:{name}"
-- ARGV[7]  "1" if the ticket was queued before and must not be queued again
--          (a campaign's: a candidate that lost its place is told, not requeued)
-- ARGV[8]  the semaphore's N (0: not a semaphore)
--
-- Admission, in strict FIFO order across kinds (nobody live waiting ahead is
-- overtaken, except a reader by a reader):
--   exclusive: no holder of any kind, and the queue is empty or the caller
--              is its head;
--   reader:    no exclusive holder, and no live waiter of another kind ahead
--              of the caller (a try: none in the queue);
--   permits:   no exclusive holder, the weights held plus the caller's at
--              most N, and the queue is empty or the caller is its head.
-- A grant INCRs the counter for its token. An exclusive grant SETs the lock
-- with PX; a shared grant adds the ticket to the holders scored by its
-- expiry, and wakes the next waiter (it may share too). Dead tickets at the
-- head are dropped first, and expired shared holders; if that leaves the
-- lock free with another live waiter first in line, that waiter is woken (the
-- wake may have gone to a dead one). An exclusive grant publishes
-- "g{token}:{identity and value}" on the election channel.
-- Returns {1, token}: granted (also when this ticket holds the lock already:
--                     a retried attempt whose first answer was lost);
--         {2}: ARGV[7] is "1" and the ticket is no longer queued (its waiter
--              key expired and it was dropped); nothing changed;
--         {3, N kept}: the lock keeps another N (0: it is a semaphore and
--              this is not, or the other way round); nothing changed;
--         {0, exclusive holder's value or '', ms until the first holder
--          expires (-2: none), waiters, 1 if the caller is first in line
--          else 0}: not granted.

local lock, queue, counter, holder_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local holders, tokens, permits_key = KEYS[5], KEYS[6], KEYS[7]
local ticket, ttl, wait = ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local data, channel, queued_before = ARGV[5], ARGV[6], ARGV[7] == '1'
local permits, kind = tonumber(ARGV[8]), kind_of(ARGV[2])
local now = now_ms()
purge_shared(holders, tokens, now)

local holder = redis.call('GET', lock)
if holder and string.sub(holder, -#ticket - 1) == ':' .. ticket then
  redis.call('PEXPIRE', lock, ttl)
  redis.call('PEXPIRE', holder_key, ttl)
  return {1, string.match(holder, '^(%d+):')}
end
local mine = redis.call('HGET', tokens, ticket)
if mine then
  redis.call('ZADD', holders, 'XX', now + ttl, ticket)
  extend(holders, now + ttl)
  extend(tokens, now + ttl)
  return {1, mine}
end

local kept = tonumber(redis.call('GET', permits_key) or '0')
if kept ~= permits and (kept > 0 or redis.call('ZCARD', holders) > 0 and kind == 's') then
  return {3, kept}
end

-- Is a live waiter of another kind than a reader ahead of the caller?
local function writer_ahead()
  for _, t in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if t == ticket then return false end
    if kind_of(t) ~= 'r' and redis.call('EXISTS', waiter_key(t)) == 1 then return true end
  end
  return false
end

local head, dropped = live_head(queue, ticket)
if queued_before and head ~= ticket and not redis.call('LPOS', queue, ticket) then
  return {2}
end
local at_head = not head or head == ticket
local admitted = false
if not holder then
  if kind == 'x' then
    admitted = at_head and redis.call('ZCARD', holders) == 0
  elseif kind == 'r' then
    admitted = not writer_ahead()
  else
    admitted = at_head and used(holders) + weight_of(ticket) <= permits
  end
end
if admitted then
  redis.call('INCR', counter)
  local token = redis.call('GET', counter)
  if kind == 'x' then
    redis.call('SET', lock, token .. ':' .. ticket, 'PX', ttl)
    redis.call('SET', holder_key, token .. ':' .. data, 'PX', ttl)
    -- pcall: a user without the channel in its ACL still locks, unannounced.
    redis.pcall('PUBLISH', channel, 'g' .. token .. ':' .. data)
  else
    redis.call('ZADD', holders, now + ttl, ticket)
    redis.call('HSET', tokens, ticket, token)
    extend(holders, now + ttl)
    extend(tokens, now + ttl)
    if permits > 0 then
      redis.call('SET', permits_key, permits, 'KEEPTTL')
      extend(permits_key, now + ttl)
    end
  end
  redis.call('LREM', queue, 0, ticket)
  redis.call('DEL', waiter_key(ticket), wake_key(ticket))
  if kind ~= 'x' then wake_head(queue) end
  return {1, token}
end

-- A dead waiter may have taken the wake meant for the next one: pass it on.
if dropped and not holder and head then wake(head) end

if wait then
  if not redis.call('LPOS', queue, ticket) then
    redis.call('RPUSH', queue, ticket)
  end
  redis.call('SET', waiter_key(ticket), ttl, 'PX', ttl)
  if permits > 0 then
    redis.call('SET', permits_key, permits, 'KEEPTTL')
    extend(permits_key, now + ttl)
  end
  if not head then head = ticket end
end
local first = 0
if head == ticket then first = 1 end
local expires = -2
if holder then
  expires = redis.call('PTTL', lock)
else
  local soonest = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if soonest[2] then expires = math.max(tonumber(soonest[2]) - now, 0) end
end
return {0, holder or '', expires, redis.call('LLEN', queue), first}
