-- bucket_tokens: how many items a rate limit's bucket lets out now. Every bucket (a service's,
-- a tenant's, a user's) is one time, next_free, by the generic cell rate algorithm: with the
-- emission interval T = 1 / rate_per_second rounded up to a microsecond, an item is due while
-- next_free (or now, if later) is at most (burst − 1) × T ahead of now, and each item moves it
-- on by T (bucket_charged). So in any t seconds at most burst + rate_per_second × t items go
-- out, whichever brokers claim them; the rounding only ever lowers the rate.
--
-- Arguments: the rate (> 0), the burst and the bucket's next_free (NULL: full).
-- Answer: the items due now, 0 to burst.

CREATE OR REPLACE FUNCTION bucket_tokens(
    p_rate double precision,
    p_burst integer,
    p_next_free timestamptz
)
RETURNS bigint
LANGUAGE sql
STABLE
AS $tokens$
    SELECT CASE
               WHEN ahead_us > (p_burst - 1) * interval_us THEN 0
               ELSE ((p_burst - 1) * interval_us - ahead_us) / interval_us + 1
           END
      FROM (SELECT ceil(1000000 / p_rate)::bigint AS interval_us,
                   greatest(floor(extract(epoch FROM coalesce(p_next_free, now()) - now())
                                  * 1000000)::bigint,
                            0) AS ahead_us) bucket;
$tokens$;
