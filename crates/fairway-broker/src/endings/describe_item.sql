-- Why a status update did not apply: the item's current status and attempt, the token whose
-- claim holds it, and what its latest ending recorded (to recognise the same report sent
-- again).
SELECT status::text, attempt, claimed_by, ended_as::text, ending_digest FROM work_items WHERE id = $1;
