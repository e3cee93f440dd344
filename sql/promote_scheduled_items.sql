-- Makes up to $2 due scheduled items ready, under the promoter's advisory lock $1; `promoted`
-- is NULL when another broker's pass holds it. See sql/functions/promote_scheduled_items.sql.
SELECT promote_scheduled_items($1, $2) AS promoted;
