-- Sets user $1's policy: $2 weight, $3 max_running, $4 rate_per_second, $5 burst, $6 tier, each
-- NULL to keep the value it has (or its default, for a user not yet seen, whose row this
-- creates). A changed rate or burst starts the bucket afresh. The user's rows in the fair order
-- take the new weight, tier and cap in the same statement, under the user's row lock as claims read them, so
-- that the next claim orders by them; a row that a lower cap now leaves out is left for the
-- claim that finds it at the head of its order, as a row that lags is.
WITH changed AS (
    INSERT INTO users AS u (username, weight, max_running, rate_per_second, burst, tier)
    VALUES ($1, coalesce($2::integer, 1), coalesce($3::integer, 0),
            coalesce($4::double precision, 0), coalesce($5::integer, 1), coalesce($6::integer, 3))
        ON CONFLICT (username) DO UPDATE
       SET weight = coalesce($2::integer, u.weight),
           tier = coalesce($6::integer, u.tier),
           max_running = coalesce($3::integer, u.max_running),
           rate_per_second = coalesce($4::double precision, u.rate_per_second),
           burst = coalesce($5::integer, u.burst),
           next_free = CASE
               WHEN (coalesce($4::double precision, u.rate_per_second),
                     coalesce($5::integer, u.burst))
                    = (u.rate_per_second, u.burst) THEN u.next_free
           END,
           throttled_until = CASE
               WHEN (coalesce($4::double precision, u.rate_per_second),
                     coalesce($5::integer, u.burst))
                    = (u.rate_per_second, u.burst) THEN u.throttled_until
           END
    RETURNING u.username, u.weight, u.max_running, u.throttled_until IS NOT NULL AS throttled,
              u.tier
)
UPDATE service_users su
   SET weight = c.weight,
       tier = c.tier,
       max_running = c.max_running,
       throttled = c.throttled
  FROM changed c
 WHERE su.username = c.username;
