-- The FIFO baseline's own index: the ready items in id order.
CREATE INDEX IF NOT EXISTS bench_fifo_ready ON work_items (id) WHERE status = 'ready';
