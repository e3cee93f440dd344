-- The W3C traceparent a job was submitted with (POST /jobs's `traceparent` header), handed to
-- its workers with each item so that they continue the producer's trace. Most jobs have none.
ALTER TABLE jobs ADD COLUMN traceparent text;
