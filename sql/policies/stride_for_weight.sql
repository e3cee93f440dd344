-- stride_for_weight: how far one turn moves a row of weight p_weight on in its order's
-- virtual time: a weight-w row takes w turns while a weight-1 row takes one.
--
-- Arguments: the weight (1 to 1000).
-- Answer: the stride, 1,000,000 divided by the weight.

CREATE OR REPLACE FUNCTION stride_for_weight(p_weight integer)
RETURNS bigint
LANGUAGE sql
IMMUTABLE
AS $stride$
    SELECT 1000000::bigint / p_weight;
$stride$;
