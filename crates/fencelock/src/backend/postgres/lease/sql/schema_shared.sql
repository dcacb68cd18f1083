-- Schema additions and functions of read-write locks and semaphores (lease/shared.rs),
-- inside the transaction of schema.sql.
ALTER TABLE "{table}" ADD COLUMN IF NOT EXISTS shared_until timestamptz;
ALTER TABLE "{table}_waiters" ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'x',
    ADD COLUMN IF NOT EXISTS weight int NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS permits int NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS "{table}_shared" (
    name text NOT NULL, owner text NOT NULL, token bigint NOT NULL, weight int NOT NULL,
    permits int NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (name, owner));
CREATE OR REPLACE FUNCTION "{table}_share"(p_name text, p_owner text, p_ttl bigint, p_id bigint,
    p_kind text, p_weight int, p_permits int)
RETURNS TABLE (granted bigint, holder_token bigint, holder_left bigint, ahead bigint, ahead_left bigint,
    waiters bigint, queued boolean, kept int) LANGUAGE plpgsql AS $f$
DECLARE r record; t timestamptz; v_until timestamptz; v_token bigint; v_kept int;
    v_first timestamptz; v_soonest timestamptz; v_used bigint;
BEGIN
  INSERT INTO "{table}" (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
  SELECT l.token AS token, (l.owner IS NOT NULL AND l.expires_at > clock_timestamp()) AS held,
      l.expires_at AS expires_at INTO r FROM "{table}" l WHERE l.name = p_name FOR UPDATE;
  t := clock_timestamp();
  v_until := t + p_ttl * interval '1 microsecond';
  DELETE FROM "{table}_shared" s WHERE s.name = p_name AND s.expires_at <= t;
  waiters := (SELECT count(*) FROM "{table}_waiters" w WHERE w.name = p_name AND w.expires_at > t);
  ahead := 0; queued := false;
  SELECT s.token INTO v_token FROM "{table}_shared" s WHERE s.name = p_name AND s.owner = p_owner;
  IF v_token IS NULL THEN
    SELECT s.permits INTO v_kept FROM "{table}_shared" s WHERE s.name = p_name LIMIT 1;
    IF v_kept IS NULL THEN
      SELECT w.permits INTO v_kept FROM "{table}_waiters" w WHERE w.name = p_name AND w.kind = 's'
          AND w.id <> p_id AND w.expires_at > t LIMIT 1;
    END IF;
    IF v_kept IS NOT NULL AND v_kept <> p_permits THEN
      kept := v_kept; RETURN NEXT; RETURN;
    END IF;
    SELECT count(*), min(w.expires_at) INTO ahead, v_first FROM "{table}_waiters" w
        WHERE w.name = p_name AND w.id < p_id AND w.expires_at > t AND (p_kind = 's' OR w.kind <> 'r');
    SELECT coalesce(sum(s.weight), 0), min(s.expires_at) INTO v_used, v_soonest FROM "{table}_shared" s
        WHERE s.name = p_name;
    IF r.held THEN
      holder_token := r.token;
      holder_left := greatest(0, ceil(extract(epoch FROM r.expires_at - t) * 1000000))::bigint;
    ELSIF ahead > 0 THEN
      ahead_left := greatest(0, ceil(extract(epoch FROM v_first - t) * 1000000))::bigint;
    ELSIF p_kind = 's' AND v_used + p_weight > p_permits THEN
      holder_left := greatest(0, ceil(extract(epoch FROM v_soonest - t) * 1000000))::bigint;
    ELSE
      v_token := nextval('"{table}_token_seq"');
      INSERT INTO "{table}_shared" (name, owner, token, weight, permits, expires_at)
          VALUES (p_name, p_owner, v_token, p_weight, p_permits, v_until);
    END IF;
  ELSE
    UPDATE "{table}_shared" s SET expires_at = v_until WHERE s.name = p_name AND s.owner = p_owner;
  END IF;
  IF v_token IS NOT NULL THEN
    UPDATE "{table}" l SET shared_until = greatest(l.shared_until, v_until) WHERE l.name = p_name;
    DELETE FROM "{table}_waiters" w WHERE w.id = p_id;
    granted := v_token; ahead := 0;
  ELSE
    UPDATE "{table}_waiters" w SET expires_at = v_until WHERE w.id = p_id AND w.expires_at > t;
    queued := FOUND;
  END IF;
  RETURN NEXT;
END $f$;
CREATE OR REPLACE FUNCTION "{table}_reshare"(p_name text, p_owner text, p_ttl bigint)
RETURNS boolean LANGUAGE plpgsql AS $f$
DECLARE t timestamptz; v_until timestamptz;
BEGIN
  PERFORM 1 FROM "{table}" l WHERE l.name = p_name FOR UPDATE;
  t := clock_timestamp();
  v_until := t + p_ttl * interval '1 microsecond';
  UPDATE "{table}_shared" s SET expires_at = v_until
      WHERE s.name = p_name AND s.owner = p_owner AND s.expires_at > t;
  IF NOT FOUND THEN RETURN false; END IF;
  UPDATE "{table}" l SET shared_until = greatest(l.shared_until, v_until) WHERE l.name = p_name;
  RETURN true;
END $f$;
CREATE OR REPLACE FUNCTION "{table}_unshare"(p_name text, p_owner text)
RETURNS boolean LANGUAGE plpgsql AS $f$
DECLARE t timestamptz; v_live boolean;
BEGIN
  PERFORM 1 FROM "{table}" l WHERE l.name = p_name FOR UPDATE;
  t := clock_timestamp();
  DELETE FROM "{table}_shared" s WHERE s.name = p_name AND s.owner = p_owner RETURNING s.expires_at > t INTO v_live;
  DELETE FROM "{table}_shared" s WHERE s.name = p_name AND s.expires_at <= t;
  UPDATE "{table}" l SET shared_until = (SELECT max(s.expires_at) FROM "{table}_shared" s WHERE s.name = p_name)
      WHERE l.name = p_name;
  RETURN coalesce(v_live, false);
END $f$;
