-- Whether the server this connection reached is a standby in recovery, which refuses every
-- write, and which server it is, for the broker's log: its address and cluster_name. And
-- whether it holds the schema of the broker's server functions, $1.
SELECT pg_is_in_recovery() AS in_recovery,
       coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'local socket')
           || coalesce(' (' || nullif(current_setting('cluster_name'), '') || ')', '') AS host,
       to_regnamespace($1::text) IS NOT NULL AS functions_installed;
