-- The fault suite's progress and totals: items, successful items, and attempts beyond each
-- item's first (leases that expired or were released).
SELECT count(*),
       count(*) FILTER (WHERE status = 'successful'),
       coalesce(sum(greatest(attempt - 1, 0)), 0)::bigint
  FROM work_items;
