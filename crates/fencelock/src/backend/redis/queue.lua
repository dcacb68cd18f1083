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
