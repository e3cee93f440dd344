-- retry_ms_until: in how many milliseconds a claim held back by a rate limit should look
-- again, for a bucket whose next item is due at p_due (bucket_due): at least 1, so that a
-- long poll never spins.
--
-- Arguments: the time the next item is due (NULL: now).
-- Answer: milliseconds, rounded up.

CREATE OR REPLACE FUNCTION retry_ms_until(p_due timestamptz)
RETURNS bigint
LANGUAGE sql
STABLE
AS $retry$
    SELECT greatest(ceil(extract(epoch FROM coalesce(p_due, now()) - now()) * 1000)::bigint, 1);
$retry$;
