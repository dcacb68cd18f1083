-- The tokens of the live shared holders of $1.
SELECT token FROM "{table}_shared" WHERE name = $1 AND expires_at > clock_timestamp()
