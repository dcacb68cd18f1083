-- Release a shared grant: $1 name, $2 owner. True if it was live.
SELECT "{table}_unshare"($1, $2)
