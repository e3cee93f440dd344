-- Whether any job has named service $1: its first items made a tenant_queues row, and those
-- rows are never deleted. One probe of the primary key.
SELECT EXISTS (SELECT 1 FROM tenant_queues WHERE service = $1) AS named;
