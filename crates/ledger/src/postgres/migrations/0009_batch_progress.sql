-- 0009: when the provider's own counts of a batch last moved. While a batch
-- is in progress the provider reports how many of its requests are done;
-- the console shows those counts and how long they have stood still, so a
-- batch that stopped moving is seen before its stall window ends. Set by
-- every status poll whose completed or failed count differs from the last.
ALTER TABLE provider_batch ADD COLUMN counts_changed_at DOUBLE PRECISION;
