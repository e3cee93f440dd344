-- User $1's policy and its items running now; no row for a user with neither work nor a
-- policy. A user's running count is exact: every claim and ending moves it under the user's
-- row lock.
SELECT u.username,
       u.weight,
       u.tier::integer AS tier,
       u.max_running,
       u.rate_per_second,
       u.burst,
       u.running_count::bigint AS running,
       u.max_running > 0 AND u.running_count >= u.max_running AS at_cap,
       u.throttled_until
  FROM users u
 WHERE u.username = $1;
