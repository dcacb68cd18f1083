-- Check: $1 name. The last grant's token, and whether it is live.
SELECT token, owner IS NOT NULL AND expires_at > clock_timestamp() FROM "{table}" WHERE name = $1
