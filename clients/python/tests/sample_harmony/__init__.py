"""A small Harmony service for the tests, written as any harmony-service-lib service is: an
adapter that rewrites each granule's text (upper case), an aggregating one that concatenates
every granule it is given into one, and one that works as nasa/harmony-service-example does
(fixed output names in the message's staging location; misbehaving on request)."""
