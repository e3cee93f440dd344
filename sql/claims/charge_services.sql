-- charge_services: bills each rate-limited service's bucket for the items a claim batch handed
-- out (bucket_charged). Called by claim_items last, in the transaction whose admit_services
-- locked the rows, so that no other claim of the service reads the bucket in between.
--
-- Arguments: the batch's services, and how many items request i took (p_taken[i]).
-- Locks: none beyond the rows admit_services holds.

CREATE OR REPLACE FUNCTION charge_services(p_services text[], p_taken integer[])
RETURNS void
LANGUAGE plpgsql
AS $charge$
BEGIN
    UPDATE service_policies sp
       SET next_free = bucket_charged(sp.rate_per_second, sp.next_free, t.items)
      FROM (SELECT r.service, sum(r.taken) AS items
              FROM unnest(p_services, p_taken) AS r(service, taken)
             GROUP BY r.service) t
     WHERE sp.service = t.service
       AND sp.rate_per_second > 0
       AND t.items > 0;
END;
$charge$;
