-- fencelock RedisFence: check a fencing token against a key's marks, raise
-- them and perform one read or write, atomically (a script runs alone on the
-- server).
--
-- KEYS[1]   the mark key, e.g. "fencelock:fence:<resource key>"
-- KEYS[2]   the key the read or write goes to (absent for NONE and READ)
-- ARGV[1]   the token: canonical decimal in 1..9223372036854775807
-- ARGV[2]   the op: NONE | READ | GET | SET | DEL | APPEND | HSET
--           (READ and GET are reads, the others writes; NONE and READ
--           touch no data key)
-- ARGV[3..] its arguments: SET value | APPEND value | HSET field value [field value ...]
--
-- The marks: "W:S" (W the last write's token, 0 if none; S the highest
-- token admitted), or a single decimal "S" when W = S (so a mark written
-- before fenced reads, a single number, means W = S). The rule:
--   a read  is admitted iff token >= W; then S = max(S, token)
--   a write is admitted iff token >= S; then W = S = token
--
-- Returns {1, token, reply}: admitted; reply is the write's integer reply
--                            (DEL, APPEND, HSET), GET's value (false if
--                            none), else 0
--         {0, mark}:         stale (token < mark: W for a read, S for a
--                            write); nothing was read or written
-- Fails with an error, writing nothing, on a bad token, a bad op, or a write
-- that Redis refuses (e.g. WRONGTYPE).

-- Tokens are compared as decimal strings: Lua numbers are doubles and are
-- not exact above 2^53.
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local token, op = ARGV[1], ARGV[2]
if not string.match(token, '^[1-9][0-9]*$') or less('9223372036854775807', token) then
  return redis.error_reply('ERR fencelock: token must be a decimal in 1..9223372036854775807')
end
local nargs = #ARGV - 2
local shape_ok = ((op == 'NONE' or op == 'READ') and nargs == 0 and #KEYS == 1)
  or ((op == 'SET' or op == 'APPEND') and nargs == 1 and #KEYS == 2)
  or ((op == 'DEL' or op == 'GET') and nargs == 0 and #KEYS == 2)
  or (op == 'HSET' and nargs >= 2 and nargs % 2 == 0 and #KEYS == 2)
if not shape_ok then
  return redis.error_reply('ERR fencelock: unsupported op or wrong arguments')
end

local stored = redis.call('GET', KEYS[1])
local w, s = '0', '0'
if stored then
  w, s = string.match(stored, '^([0-9]+):([0-9]+)$')
  if not w then w, s = stored, stored end
end

local reading = (op == 'READ' or op == 'GET')
if reading then
  if less(token, w) then return {0, w} end
  if less(s, token) then s = token end
else
  if less(token, s) then return {0, s} end
  w, s = token, token
end

-- The act first, the marks after: a write Redis refuses leaves both as
-- they were (a script is not rolled back on error, so order matters).
local reply = 0
if op ~= 'NONE' and op ~= 'READ' then
  local args = {op, KEYS[2]}
  for i = 3, #ARGV do args[#args + 1] = ARGV[i] end
  local r = redis.pcall(unpack(args))
  if type(r) == 'table' and r.err then
    return r
  end
  if type(r) == 'number' or op == 'GET' then reply = r end
end
local marks = s
if w ~= s then marks = w .. ':' .. s end
if marks ~= stored then
  redis.call('SET', KEYS[1], marks)
end
return {1, token, reply}
