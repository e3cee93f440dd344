-- One index entry fewer for every claim, ending and new item. Each read of a job step's items
-- that are not ready names the status it wants, and work_items_by_job_status serves it as a
-- range.
DROP INDEX work_items_by_step;
