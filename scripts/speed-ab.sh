#!/usr/bin/env bash
# Tells the machine's speed apart from the code's: the two speed figures of
# `cargo bench --bench engine -- speed cpu` (README: Benchmarks) for an older
# commit's binary and this checkout's, on the same machine, runs alternating
# OLD, NEW, OLD, NEW... so load and the machine's day fall on both. This
# 2-core machine's speed varies by more than 2x from day to day; a figure
# alone says little, the ratio new/old says what the code changed.
#
#   scripts/speed-ab.sh OLD_REV [ROUNDS]
#
#   C: client CPU per request: `docket run` (its CPU-seconds at exit, set-up
#      included) over 20,000 requests, `docket mock-provider` as its own
#      process with 50 ms latency, concurrency 100 (target 0.25 ms).
#   D: requests/s from session start to completion over 30,000 items, no
#      latency, no limit, concurrency 64 (target 8,000/s).
#
# Builds OLD_REV in a worktree under $SPEED_AB_DIR (default
# ~/.cache/docket-speed-ab: outside this checkout, where cargo would take an
# old single-crate commit for a member of this workspace and refuse it),
# about 7 minutes on 2 cores the first time, and this checkout with
# `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
old_rev=${1:?usage: scripts/speed-ab.sh OLD_REV [ROUNDS]}
rounds=${2:-3}
root=$(realpath -m "${SPEED_AB_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/docket-speed-ab}")
old_sha=$(git rev-parse --short=9 "$old_rev^{commit}")
mkdir -p "$root"
if [ ! -d "$root/src-$old_sha" ]; then
    git worktree add --detach -q "$root/src-$old_sha" "$old_sha"
fi
(cd "$root/src-$old_sha" && CARGO_TARGET_DIR="$root/target-$old_sha" cargo build --release --bin docket -q)
cargo build --release --bin docket -q
old_bin="$root/target-$old_sha/release/docket"
new_bin=$(realpath target/release/docket)

work=$(mktemp -d)
mock_pid=
trap '[ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null; rm -rf "$work"' EXIT
"$new_bin" init "$work/scaffold" >/dev/null
python3 - "$work/scaffold" "$work" <<'PY'
import json, sys
ws, out = sys.argv[1], sys.argv[2]
sample = [json.loads(l) for l in open(f"{ws}/items/sample.jsonl") if l.strip()]
for n in (20000, 30000):
    with open(f"{out}/items{n}.jsonl", "w") as f:
        for i in range(n):
            row = dict(sample[i % len(sample)])
            row["id"] = f"item-{i:07d}"
            f.write(json.dumps(row) + "\n")
PY

port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")

# One run: $1 = binary, $2 = items, $3 = concurrency, then mock flags.
# Leaves the workspace in $work/ws and the run's stderr in $work/err.txt.
run() {
    local bin=$1 items=$2 concurrency=$3; shift 3
    rm -rf "$work/ws" "$work/home"; mkdir -p "$work/home"
    HOME="$work/home" "$bin" init "$work/ws" >/dev/null
    cat >"$work/ws/docket.toml" <<TOML
[job]
name = "speed-ab"

[providers.main]
kind = "openai_compatible"
model = "gpt-4o-mini"
base_url = "http://127.0.0.1:$port/v1"
requests_per_minute = 0
tokens_per_minute = 0
max_concurrency = $concurrency
request_timeout_secs = 10
max_transport_attempts = 5

[[stages]]
name = "adjudicate"
provider = "main"
template = "prompts/adjudicate.j2"
system_prompt = "prompts/system.txt"
max_tokens = 200
max_attempts = 3

[stages.gate]
kind = "json_schema"
schema = "schemas/adjudicate.schema.json"

[routing]
auto_accept_threshold = 0.85
review_threshold = 0.60
TOML
    HOME="$work/home" "$bin" --workspace "$work/ws" import "$work/items$items.jsonl" >/dev/null
    HOME="$work/home" "$bin" mock-provider --port "$port" --log-capacity 1000 "$@" >/dev/null 2>&1 &
    mock_pid=$!
    sleep 0.3
    HOME="$work/home" DOCKET_REPORT_PEAK_RSS=1 "$bin" --workspace "$work/ws" run --yes --headless \
        >"$work/out.txt" 2>"$work/err.txt" || { echo "the run of $bin failed:"; tail -20 "$work/out.txt"; exit 1; }
    kill "$mock_pid"; wait "$mock_pid" 2>/dev/null || true; mock_pid=
}
cpu_secs() { sed -n 's/^cpu_secs=//p' "$work/err.txt"; }

declare -A c_ms d_rate
measure() { # $1 = label, $2 = binary, $3 = round
    run "$2" 20000 100 --latency-median-ms 50 --latency-p99-ms 60
    local ms; ms=$(python3 -c "print(round($(cpu_secs) / 20000 * 1000, 3))")
    run "$2" 30000 64
    local rate; rate=$(sqlite3 "$work/ws/docket.sqlite" \
        "SELECT CAST(processed_count / (completed_at - started_at) AS INTEGER) FROM llm_batch_session ORDER BY started_at DESC LIMIT 1")
    printf '%-4s round %d: C %.3f ms/request   D %d requests/s\n' "$1" "$3" "$ms" "$rate"
    c_ms[$1]+="$ms "
    d_rate[$1]+="$rate "
}
for r in $(seq 1 "$rounds"); do
    measure old "$old_bin" "$r"
    measure new "$new_bin" "$r"
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
co=$(median <<<"${c_ms[old]}"); cn=$(median <<<"${c_ms[new]}")
do_=$(median <<<"${d_rate[old]}"); dn=$(median <<<"${d_rate[new]}")
echo "old $old_sha, new $(git rev-parse --short=9 HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)'), rounds $rounds"
printf 'median C: old %s ms, new %s ms, new/old %.3f (lower is better)\n' "$co" "$cn" "$(python3 -c "print($cn/$co)")"
printf 'median D: old %s/s, new %s/s, new/old %.3f (higher is better)\n' "$do_" "$dn" "$(python3 -c "print($dn/$do_)")"
