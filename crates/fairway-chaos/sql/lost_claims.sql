-- Of the claims answered 2xx, as (item $1[i], attempt $2[i]), those whose lease the database
-- never recorded: the item is missing or has not reached that attempt.
SELECT acked.item, acked.attempt
  FROM unnest($1::bigint[], $2::integer[]) AS acked(item, attempt)
  LEFT JOIN work_items ON work_items.id = acked.item
 WHERE work_items.id IS NULL OR work_items.attempt < acked.attempt;
