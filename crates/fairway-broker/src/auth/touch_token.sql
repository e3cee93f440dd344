-- Token $1 was used: its last use moves, at most once a minute whichever broker saw it.
UPDATE tokens
   SET last_used_at = now()
 WHERE id = $1
   AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');
