-- A shared grant attempt (lease/shared.rs): the grant statement's columns.
-- $1 name, $2 owner, $3 TTL in µs, $4 queue id, $5 kind, $6 weight, $7 permits.
SELECT * FROM "{table}_share"($1, $2, $3, $4, $5, $6, $7)
