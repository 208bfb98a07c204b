-- 0010: review items sent by the audit sample. A job may send a share of
-- the items routing auto-accepts (or rejects) to review as well, so the
-- precision of each band is measured by people, not assumed (`docket
-- calibrate`). Their route stays what the model said; `audit` = 1 marks
-- them in the queue, on the card and in the exports.
ALTER TABLE review_item ADD COLUMN audit BIGINT NOT NULL DEFAULT 0;
