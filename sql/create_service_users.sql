-- Makes sure user $1 has a service_users row for each service in $2, so that later counter
-- changes only ever update rows.
INSERT INTO service_users (service, username, running_count, last_worked)
SELECT DISTINCT s.service, u.username, u.running_count, u.last_worked
  FROM users u, unnest($2::text[]) AS s(service)
 WHERE u.username = $1
    ON CONFLICT (service, username) DO NOTHING;
