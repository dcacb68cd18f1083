-- fencelock Redis backend: the waiter queue, shared by acquire.lua,
-- release.lua and withdraw.lua (prepended to each of them).
--
-- ARGV[1]  the key prefix with its separator, e.g. "fencelock:"
--
-- A waiter is a ticket (32 hex digits) in the list "{prefix}queue:{name}",
-- first in line at index 0. "{prefix}waiter:{ticket}" proves that the waiter
-- is alive: it holds the waiter's TTL in ms and expires after it unless the
-- waiter refreshes it. "{prefix}wake:{ticket}" is the list the waiter
-- BLPOPs on; pushing to it wakes that waiter and no other.

local prefix = ARGV[1]

local function waiter_key(ticket) return prefix .. 'waiter:' .. ticket end
local function wake_key(ticket) return prefix .. 'wake:' .. ticket end

-- The first live ticket of `queue` (false if none), and whether dead
-- tickets were dropped from the head on the way (their waiter key expired).
-- `mine` counts as live (the caller is the proof).
local function live_head(queue, mine)
  local dropped = false
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then return false, dropped end
    if head == mine or redis.call('EXISTS', waiter_key(head)) == 1 then return head, dropped end
    redis.call('LPOP', queue)
    redis.call('DEL', wake_key(head))
    dropped = true
  end
end

-- Wakes the waiter of `ticket`, and only it: one element on its wake list,
-- which expires with the waiter's liveness TTL if nobody pops it.
local function wake(ticket)
  local live = tonumber(redis.call('GET', waiter_key(ticket))) or 1000
  redis.call('LPUSH', wake_key(ticket), '1')
  redis.call('PEXPIRE', wake_key(ticket), live)
end

-- Wakes the first live waiter of `queue`, if any.
local function wake_head(queue)
  local head = live_head(queue, false)
  if head then wake(head) end
end

-- Shared holders (readers of a read-write lock, permits of a semaphore):
-- a ticket is "{32 hex digits}" for an exclusive request, with "r" after it
-- for a reader, with "s{weight}" after it for a semaphore's permits.
-- "{prefix}holders:{name}" is a sorted set of the shared holders' tickets,
-- scored by their expiry (ms, the server's clock); "{prefix}tokens:{name}"
-- a hash of their tokens; "{prefix}permits:{name}" a semaphore's N.

local function kind_of(ticket)
  local kind = string.sub(ticket, 33, 33)
  if kind == '' then return 'x' end
  return kind
end

local function weight_of(ticket)
  if kind_of(ticket) ~= 's' then return 1 end
  return tonumber(string.sub(ticket, 34)) or 1
end

-- The server's clock in ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Makes `key` live at least until `at` (ms), never shorter.
local function extend(key, at)
  if redis.call('PEXPIREAT', key, at, 'GT') == 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, at)
  end
end

-- Drops the shared holders whose expiry has passed.
local function purge_shared(holders, tokens, now)
  local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  for _, ticket in ipairs(expired) do redis.call('HDEL', tokens, ticket) end
  if #expired > 0 then redis.call('ZREMRANGEBYSCORE', holders, '-inf', now) end
end

-- The permits the shared holders take (each reader counts 1).
local function used(holders)
  local sum = 0
  for _, ticket in ipairs(redis.call('ZRANGE', holders, 0, -1)) do sum = sum + weight_of(ticket) end
  return sum
end
