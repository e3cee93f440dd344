-- Waits for the users row of the best user with claimable work for service $1. Used only when
-- claim_next_item found every such user locked by concurrent claims: a lone user must still get
-- every worker, one claim after another. Returns no row when the service has no claimable work.
SELECT u.username
  FROM users u
 WHERE u.username = (
           SELECT su.username
             FROM service_users su
            WHERE su.service = $1
              AND su.ready_count > 0
            ORDER BY su.running_count, su.last_worked NULLS FIRST, su.username
            LIMIT 1
       )
   FOR NO KEY UPDATE;
