-- lower_ready_from: keeps user_work.ready_from a lower bound of its step's ready item ids
-- when an item becomes ready again (a retry, an expired lease), so that claims, which start
-- reading the step's ready items at ready_from, still find it. Claims raise the bound; this
-- lowers it. The trigger binding follows the function, since it can only be made once the
-- function exists.
--
-- Why a trigger, not a statement the broker calls: an item becomes ready again by a retry at
-- once, an expired lease, a release, an operator's retry and the promoter, in several
-- functions and statements. A path that forgot to lower the bound would hide the item from
-- every claim for good; the trigger follows the item's status, whoever writes it.
--
-- Locks: the item's user_work row, which the transaction that changes the item already holds
-- through its owner's users row.

CREATE OR REPLACE FUNCTION lower_ready_from()
RETURNS trigger
LANGUAGE plpgsql
AS $lower$
BEGIN
    UPDATE user_work uw
       SET ready_from = NEW.id
     WHERE (uw.job_id, uw.step_index, uw.component) = (NEW.job_id, NEW.step_index, NEW.component)
       AND uw.ready_from > NEW.id;
    RETURN NULL;
END;
$lower$;

CREATE OR REPLACE TRIGGER work_items_ready_again
    AFTER UPDATE OF status ON work_items
    FOR EACH ROW
    WHEN (NEW.status = 'ready' AND OLD.status <> 'ready')
    EXECUTE FUNCTION lower_ready_from();
