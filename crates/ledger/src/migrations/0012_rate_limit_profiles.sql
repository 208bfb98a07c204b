-- 0012: named rate-limit profiles (`docket profile set|list|show`). Each
-- `set` adds a version; none is ever changed or removed, so a session can
-- always say which limits it ran with. `provider` is the provider's name in
-- docket.toml; `model`, when set, narrows the profile to that model;
-- `limits_json` holds the provider-section keys it overrides.
CREATE TABLE rate_limit_profile (
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    provider    TEXT NOT NULL,
    model       TEXT,
    limits_json TEXT NOT NULL,
    created_at  REAL NOT NULL,
    created_by  TEXT,
    PRIMARY KEY (name, version)
);
-- The profile and version a session ran with (`batch-adjudicate --profile`).
ALTER TABLE llm_batch_session ADD COLUMN profile_name TEXT;
ALTER TABLE llm_batch_session ADD COLUMN profile_version INTEGER;
