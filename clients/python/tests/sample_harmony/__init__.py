"""A small Harmony service for the tests, written as any harmony-service-lib service is: an
adapter that rewrites each granule's text (upper case), and an aggregating one that
concatenates every granule it is given into one."""
