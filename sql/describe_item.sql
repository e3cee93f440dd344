-- Why a status update did not apply: the item's current status and attempt.
SELECT status::text, attempt FROM work_items WHERE id = $1;
