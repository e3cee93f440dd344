-- Job $1's tenant, for a tenant-scoped token: no row, no such job.
SELECT tenant FROM jobs WHERE job_id = $1;
