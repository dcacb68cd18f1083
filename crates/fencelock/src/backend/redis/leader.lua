-- fencelock Redis backend: the leader of an election, read at once.
--
-- KEYS[1]  "{prefix}lock:{name}"
-- KEYS[2]  "{prefix}holder:{name}"
--
-- Returns {} if nobody holds the lock, else {the lock's value
-- "{token}:{ticket}", the holder key's "{token}:{identity and value}" or ''
-- (a holder that stored none), the lock's PTTL in ms}.
local lock = redis.call('GET', KEYS[1])
if not lock then return {} end
return {lock, redis.call('GET', KEYS[2]) or '', redis.call('PTTL', KEYS[1])}
