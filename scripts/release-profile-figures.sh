#!/usr/bin/env bash
# The figures behind the release profile's `lto` and `codegen-units`
# (README: Building): the binary's size, and the wall and CPU time of the
# same headless run (N items through the in-process mock with no latency, no
# faults and no rate limit, so docket's own work is what is timed), for a
# release build without LTO (16 codegen units) and one with fat LTO and one
# codegen unit. Runs alternate A, B, A, B... so machine load falls on both.
#
#   scripts/release-profile-figures.sh [ITEMS] [ROUNDS]
#
# Builds into target/profile-figures/{plain,lto} (about 10 and 15 minutes
# on 2 cores the first time). Prints one line per run, then the medians and
# the ratios lto/plain.
set -euo pipefail
cd "$(dirname "$0")/.."
items=${1:-20000}
rounds=${2:-3}
root=${PROFILE_FIGURES_DIR:-target/profile-figures}
build() { # $1 = name, then env assignments
    local name=$1; shift
    env "$@" CARGO_TARGET_DIR="$root/$name" cargo build --release --bin docket -q
}
build plain CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
build lto CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One workspace template: the scaffold with the mock made instant and faultless.
"$root/plain/release/docket" init "$work/template" >/dev/null
python3 - "$work/template" "$items" <<'PY'
import json, re, sys
ws, n = sys.argv[1], int(sys.argv[2])
toml = open(f"{ws}/docket.toml").read()
for key, value in [("requests_per_minute", "0"), ("tokens_per_minute", "0"),
                   ("max_concurrency", "64"), ("latency_median_ms", "0.0"),
                   ("latency_p99_ms", "0.0"), ("fail_500", "0.0"), ("malformed", "0.0"),
                   ("truncated", "0.0"), ("wrong_schema", "0.0")]:
    toml = re.sub(rf"^{key} = [^\n#]*", f"{key} = {value} ", toml, flags=re.M)
open(f"{ws}/docket.toml", "w").write(toml)
sample = [json.loads(l) for l in open(f"{ws}/items/sample.jsonl") if l.strip()]
with open(f"{ws}/items.jsonl", "w") as out:
    for i in range(n):
        row = dict(sample[i % len(sample)])
        row["id"] = f"item-{i:07d}"
        out.write(json.dumps(row) + "\n")
PY

declare -A walls cpus
run() { # $1 = variant, $2 = round
    local bin; bin=$(realpath "$root/$1/release/docket"); local ws="$work/$1-$2"
    cp -r "$work/template" "$ws"
    (cd "$ws" && "$bin" import items.jsonl >/dev/null)
    (cd "$ws" && HOME="$ws/home" /usr/bin/time -o "$ws/time.txt" -f "%e %U %S %M" \
        "$bin" batch-adjudicate --headless --yes >"$ws/run.out" 2>&1) ||
        { echo "the $1 run failed:"; tail -20 "$ws/run.out"; exit 1; }
    local wall user sys rss cpu
    read -r wall user sys rss <"$ws/time.txt"
    cpu=$(python3 -c "print(round($user + $sys, 2))")
    printf '%-6s round %d: wall %6.2f s  cpu %6.2f s  max rss %6d KiB\n' "$1" "$2" "$wall" "$cpu" "$rss"
    walls[$1]+="$wall "
    cpus[$1]+="$cpu "
    rm -rf "$ws"
}
for r in $(seq 1 "$rounds"); do run plain "$r"; run lto "$r"; done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
size_plain=$(stat -c %s "$root/plain/release/docket")
size_lto=$(stat -c %s "$root/lto/release/docket")
wp=$(median <<<"${walls[plain]}"); wl=$(median <<<"${walls[lto]}")
cp_=$(median <<<"${cpus[plain]}"); cl=$(median <<<"${cpus[lto]}")
echo "items $items, rounds $rounds"
printf 'binary size: plain %d bytes, lto %d bytes, lto/plain %.3f\n' "$size_plain" "$size_lto" \
    "$(python3 -c "print($size_lto/$size_plain)")"
printf 'median wall: plain %s s, lto %s s, lto/plain %.3f\n' "$wp" "$wl" "$(python3 -c "print($wl/$wp)")"
printf 'median cpu:  plain %s s, lto %s s, lto/plain %.3f\n' "$cp_" "$cl" "$(python3 -c "print($cl/$cp_)")"
