-- A batch of endings runs its statements from plans made once per connection.
--
-- PL/pgSQL plans a statement for its first five calls with the batch's own arrays, then keeps
-- that "custom" way whenever a generic plan looks dearer than the custom ones did: priced for
-- arrays of unknown length, it usually does. Three of finish_items' statements were therefore
-- planned again on almost every call (1,000 users, 10,000 items: 1,704 to 1,705 plans in 3,882
-- batches for the owner list and for the deferred endings' rows), planning taking five times
-- as long as running them: about 0.14 ms a batch, with the batch's owners held meanwhile.
--
-- Every statement of a batch of endings is a primary-key probe per item or per owner, in its
-- generic plan as in its custom ones (pinned by tests/api/plans.rs, which checks both).
ALTER FUNCTION finish_items(bigint[], integer[], text[], jsonb[], text[], text[], boolean, boolean)
    SET plan_cache_mode = force_generic_plan;
