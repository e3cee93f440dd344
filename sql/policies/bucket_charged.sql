-- bucket_charged: a bucket's next_free once p_items more items have gone out (bucket_tokens
-- tells the algorithm): moved on by one emission interval per item, from now when the bucket
-- had filled.
--
-- Arguments: the rate (> 0), the bucket's next_free (NULL: full), the items handed out.
-- Answer: the new next_free.

CREATE OR REPLACE FUNCTION bucket_charged(
    p_rate double precision,
    p_next_free timestamptz,
    p_items bigint
)
RETURNS timestamptz
LANGUAGE sql
STABLE
AS $charged$
    SELECT greatest(coalesce(p_next_free, now()), now())
           + p_items * ceil(1000000 / p_rate) * interval '1 microsecond';
$charged$;
