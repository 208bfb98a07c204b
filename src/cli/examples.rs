//! The "Examples:" block under each command's `--help`: the commands a
//! new user would type, with a session id shaped like the ones docket makes.

pub const DEMO: &str = "Examples:
  docket demo                        the demo in the console (q quits)
  docket demo --headless --items 50  line output, 50 items
  docket demo --keep                 watch the last demo's ledger again
  docket demo --workspace /tmp/try   the demo in a folder of your choice";

pub const CONSOLE: &str = "Examples:
  docket                                         the console on this workspace
  docket console --session batch_20261126_b7rj84
  docket console --read-only                     watch only: no decisions, no controls";

pub const REVIEW: &str = "Examples:
  docket review
  docket review --workspace ~/jobs/charts";

pub const INIT: &str = "Examples:
  docket init charts                 a one-stage job in ./charts
  docket init --example critic pair  adjudicate, then a critic stage
  docket init myjob --provider openai   OpenAI instead of the mock (key in OPENAI_API_KEY)
  docket init --force                rewrite the scaffold files here";

pub const DOCTOR: &str = "Examples:
  docket doctor                      every check; exit 1 if one FAILed
  docket doctor --offline            no request to the providers
  docket doctor --format json | jq '.checks[] | select(.status != \"ok\")'
  docket doctor --workspace ~/jobs/charts";

pub const IMPORT: &str = "Examples:
  docket import items.jsonl
  docket import chart_rows.csv --id-field chart_id
  docket import dump.txt --format jsonl --strict   all rows or none
  docket import items.jsonl --update   replace changed evidence; the next run re-asks those
  docket import items.jsonl --output-format json   the summary as JSON";

pub const RUN: &str = "Examples:
  docket batch-adjudicate --dry-run                 counts, cost estimate, first prompt (no key needed)
  docket batch-adjudicate --dry-run --format json   the estimate as one JSON document
  docket batch-adjudicate --yes --format json       progress on stderr, the summary as JSON
  docket batch-adjudicate --yes --max-cost 5        stop (resumable) before $5 is spent
  docket batch-adjudicate --headless --limit 100    line output, 100 items
  docket batch-adjudicate --resume batch_20261126_b7rj84
  docket batch-adjudicate --yes --profile night      the limits of rate-limit profile \"night\"
  docket run --requests batch.jsonl --provider openai     send OpenAI Batch lines as written; batch.results.jsonl
  docket run --requests batch.jsonl --provider anthropic --model claude-haiku-4-5 --mode batch";

pub const WORKER: &str = "Examples:
  docket worker --session batch_20261126_b7rj84
  docket worker --session batch_20261126_b7rj84 --ledger postgres://docket@db/charts";

pub const WORKERS: &str = "Examples:
  docket workers batch_20261126_b7rj84
  docket workers batch_20261126_b7rj84 --format json";

pub const RESULTS: &str = "Examples:
  docket batch-results batch_20261126_b7rj84
  docket batch-results batch_20261126_b7rj84 --format csv > results.csv";

pub const CALIBRATE: &str = "Examples:
  docket calibrate                                   the newest session, at its job's target precision
  docket calibrate --session batch_20261126_b7rj84 --target-precision 0.95
  docket calibrate --apply                           write the suggested auto_accept_threshold
  docket calibrate --format json | jq '.suggestion'";

pub const SESSIONS: &str = "Examples:
  docket sessions
  docket sessions --format json | jq '.[0].session_id'";

pub const EXPORT: &str = "Examples:
  docket export > results.csv
  docket export --what decisions --format jsonl -o decisions.jsonl
  docket export --what items --session batch_20261126_b7rj84 --format parquet -o items.parquet
  docket export --what attempts --session batch_20261126_b7rj84 -o attempts.csv   raw answers too";

pub const REPORT: &str = "Examples:
  docket report batch_20261126_b7rj84                    writes report-batch_20261126_b7rj84.html
  docket report batch_20261126_b7rj84 -o run.html
  docket report batch_20261126_b7rj84 -o - > run.html    to standard output";

pub const PAUSE: &str = "Examples:
  docket pause batch_20261126_b7rj84     (docket resume ID continues it)
  docket pause batch_20261126_b7rj84 --format json";

pub const RESUME: &str = "Examples:
  docket resume batch_20261126_b7rj84
  docket resume batch_20261126_b7rj84 --format json
  (a session no process works on any more: docket batch-adjudicate --resume ID)";

pub const CANCEL: &str = "Examples:
  docket cancel batch_20261126_b7rj84
  docket cancel batch_20261126_b7rj84 --format json";

pub const STOP_AT_STAGE: &str = "Examples:
  docket stop-at-stage batch_20261126_b7rj84
  docket stop-at-stage batch_20261126_b7rj84 --format json";

pub const PROFILE_LIST: &str = "Examples:
  docket profile list
  docket profile list --format json | jq '.[].name'";

pub const PROFILE_SHOW: &str = "Examples:
  docket profile show night                every version of profile night, oldest first
  docket profile show night --format json";

pub const PROFILE_SET: &str = "Examples:
  docket profile set night --provider openai --rpm 3000 --concurrency 32
  docket profile set gentle --provider openai --model gpt-4o-mini --rpm 60 --concurrency 1
  docket batch-adjudicate --profile gentle --yes    run with it (the session records gentle@1)";

pub const LEDGER_COPY: &str = "Examples:
  PGPASSWORD=... docket ledger copy --to postgres://docket@db.internal/charts
  PGPASSWORD=... docket ledger copy --from postgres://docket@db.internal/charts";

pub const MOCK_PROVIDER: &str = "Examples:
  docket mock-provider --port 8089
  docket mock-provider --latency-median-ms 200 --rpm-limit 600 --fail-500 0.02";

pub const COMPLETIONS: &str = "Examples:
  docket completions bash > ~/.local/share/bash-completion/completions/docket
  docket completions zsh > ~/.zfunc/_docket        (with fpath+=~/.zfunc in ~/.zshrc)
  docket completions fish > ~/.config/fish/completions/docket.fish";

pub const MAN: &str = "Examples:
  docket man | man -l -                    read the page now
  docket man --out ~/.local/share/man/man1 docket.1 and one page per command";
