-- Job $1's items whose status is one of $2, in steps $3 to $4, with ids above $5: the first $6
-- of them in id order, which is the order they were made in. One range of
-- work_items_by_job_status per step and status, each stopped after $6 entries, so that a page
-- reads at most (steps × statuses × $6) index entries, however big the job; then the page's
-- rows by primary key.
WITH page AS (
    SELECT found.id
      FROM job_steps s
     CROSS JOIN unnest($2::text[]::work_item_status[]) AS wanted(status)
     CROSS JOIN LATERAL (
           SELECT wi.id
             FROM work_items wi
            WHERE wi.job_id = $1
              AND wi.status = wanted.status
              AND wi.step_index = s.step_index
              AND wi.id > $5
            ORDER BY wi.id
            LIMIT $6
           ) found
     WHERE s.job_id = $1
       AND s.step_index BETWEEN $3 AND $4
     ORDER BY found.id
     LIMIT $6
)
SELECT wi.id, wi.step_index, wi.status::text, wi.attempt, wi.payload, wi.inputs, wi.results,
       wi.error, wi.warning, wi.releases, wi.release_reason, wi.not_before, wi.created_at,
       wi.updated_at
  FROM page
  JOIN work_items wi ON wi.id = page.id
 ORDER BY wi.id;
