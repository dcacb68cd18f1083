-- Renew a shared grant: $1 name, $2 owner, $3 TTL in µs. False: gone.
SELECT "{table}_reshare"($1, $2, $3)
