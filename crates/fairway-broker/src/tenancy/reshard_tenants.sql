-- Redraws every tenant's querier shard from the current members, by rendezvous hashing: each
-- tenant takes the max_queriers members with the highest hash of (tenant, querier). A member
-- joining or leaving moves a tenant's shard by at most that one querier. Tenants with
-- max_queriers 0, or at least as many as there are members, are served by every querier and
-- keep no shard rows. The caller holds the membership lock.
WITH members AS (
    SELECT querier FROM queriers WHERE in_shards
), member_count AS (
    SELECT count(*) AS n FROM members
), wanted AS (
    SELECT t.tenant, chosen.querier
      FROM tenants t
     CROSS JOIN member_count mc
     CROSS JOIN LATERAL (
           SELECT m.querier
             FROM members m
            ORDER BY ('x' || left(md5(t.tenant || E'\n' || m.querier), 16))::bit(64)::bigint DESC,
                     m.querier
            LIMIT t.max_queriers
           ) chosen
     WHERE t.max_queriers > 0
       AND t.max_queriers < mc.n
), removed AS (
    DELETE FROM tenant_shards ts
     WHERE NOT EXISTS (
               SELECT 1 FROM wanted w WHERE (w.tenant, w.querier) = (ts.tenant, ts.querier)
           )
), added AS (
    INSERT INTO tenant_shards (tenant, querier)
    SELECT tenant, querier FROM wanted
        ON CONFLICT (tenant, querier) DO NOTHING
)
UPDATE tenants t
   SET sharded = (t.max_queriers > 0 AND t.max_queriers < mc.n)
  FROM member_count mc
 WHERE t.sharded <> (t.max_queriers > 0 AND t.max_queriers < mc.n);
