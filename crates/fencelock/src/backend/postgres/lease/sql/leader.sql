-- Leader: the live holder of $1 and its holders row: token, identity, value, time left (µs).
SELECT l.token, h.identity, h.value, greatest(0, ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000000))::bigint
FROM "{table}" l LEFT JOIN "{table}_holders" h ON h.name = l.name AND h.token = l.token
WHERE l.name = $1 AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
