-- Why a status update did not apply: the item's current status and attempt, and the token
-- whose claim holds it.
SELECT status::text, attempt, claimed_by FROM work_items WHERE id = $1;
