-- Of the successes answered 2xx, as (item $1[i], attempt $2[i]), those the database does not
-- hold as that attempt's success.
SELECT acked.item, acked.attempt
  FROM unnest($1::bigint[], $2::integer[]) AS acked(item, attempt)
  LEFT JOIN work_items ON work_items.id = acked.item
 WHERE work_items.id IS NULL
    OR work_items.status <> 'successful'
    OR work_items.attempt <> acked.attempt;
