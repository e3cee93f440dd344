-- bucket_due: when an empty bucket lets its next item out (bucket_tokens tells the algorithm):
-- once next_free is no more than (burst − 1) emission intervals ahead.
--
-- Arguments: the rate (> 0), the burst and the bucket's next_free (NULL: full).
-- Answer: that time, or NULL when an item is due now.

CREATE OR REPLACE FUNCTION bucket_due(
    p_rate double precision,
    p_burst integer,
    p_next_free timestamptz
)
RETURNS timestamptz
LANGUAGE sql
STABLE
AS $due$
    SELECT CASE WHEN due > now() THEN due END
      FROM (SELECT p_next_free
                   - (p_burst - 1) * ceil(1000000 / p_rate) * interval '1 microsecond' AS due)
           bucket;
$due$;
