-- A worker may end an item successful with a warning (a Harmony service that found no data in
-- its granule): the item keeps the warning for producers and operators to read.
ALTER TABLE work_items ADD COLUMN warning text;
