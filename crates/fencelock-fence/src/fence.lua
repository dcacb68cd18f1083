-- fencelock RedisFence: check a fencing token, raise the key's mark and
-- perform one write, atomically (a script runs alone on the server).
--
-- KEYS[1]   the mark key, e.g. "fencelock:fence:<resource key>"
-- KEYS[2]   the key the write goes to (absent for op NONE)
-- ARGV[1]   the token: canonical decimal in 1..9223372036854775807
-- ARGV[2]   the op: NONE | SET | DEL | APPEND | HSET
-- ARGV[3..] its arguments: SET value | APPEND value | HSET field value [field value ...]
--
-- Returns {1, token, reply}: admitted; the mark is now token; reply is the
--                            write's integer reply (DEL, APPEND, HSET), else 0
--         {0, highest}:      stale (token < highest); nothing was written
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
local shape_ok = (op == 'NONE' and nargs == 0 and #KEYS == 1)
  or ((op == 'SET' or op == 'APPEND') and nargs == 1 and #KEYS == 2)
  or (op == 'DEL' and nargs == 0 and #KEYS == 2)
  or (op == 'HSET' and nargs >= 2 and nargs % 2 == 0 and #KEYS == 2)
if not shape_ok then
  return redis.error_reply('ERR fencelock: unsupported op or wrong arguments')
end

local highest = redis.call('GET', KEYS[1])
if highest and less(token, highest) then
  return {0, highest}
end

-- The write first, the mark after: a write Redis refuses leaves both as
-- they were (a script is not rolled back on error, so order matters).
local reply = 0
if op ~= 'NONE' then
  local args = {op, KEYS[2]}
  for i = 3, #ARGV do args[#args + 1] = ARGV[i] end
  local r = redis.pcall(unpack(args))
  if type(r) == 'table' and r.err then
    return r
  end
  if type(r) == 'number' then reply = r end
end
if highest ~= token then
  redis.call('SET', KEYS[1], token)
end
return {1, token, reply}
