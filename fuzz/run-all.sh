#!/usr/bin/env bash
# Run every fuzz target for RUNS executions (default 10,000,000), JOBS at a
# time (default 2), and print one line per target: executions, seconds,
# executions/s, and whether it crashed. Needs nightly and cargo-fuzz:
#   cargo install cargo-fuzz && fuzz/run-all.sh [RUNS] [JOBS] [TARGET...]
set -u
cd "$(dirname "$0")"
runs=${1:-10000000}
jobs=${2:-2}
shift $(( $# > 2 ? 2 : $# ))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build -s none -O >/dev/null 2>&1 || { echo "fuzz build failed: cargo +nightly fuzz build -s none -O"; exit 1; }
# The binaries run directly: no rebuild (or build lock) between targets.
bin_dir=$(dirname "$(find target -path '*/release/keymap_toml' -type f | head -1)")
export bin_dir
mkdir -p logs
run_one() {
    local t=$1 runs=$2
    # A scratch copy of the corpus: what the fuzzer adds is not committed.
    rm -rf "scratch/$t" && mkdir -p "scratch/$t"
    cp corpus/"$t"/* "scratch/$t/"
    local start end code
    start=$(date +%s.%N)
    mkdir -p "artifacts/$t"
    "$bin_dir/$t" "scratch/$t" -runs="$runs" -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" >"logs/$t.log" 2>&1
    code=$?
    end=$(date +%s.%N)
    local done
    done=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$')
    awk -v t="$t" -v n="${done:-0}" -v s="$(echo "$end - $start" | bc)" -v c="$code" \
        'BEGIN { printf "%-22s %12d execs %8.1f s %10.0f/s  %s\n", t, n, s, n / s, (c == 0 ? "no crash" : "CRASH (exit " c "): see fuzz/logs/" t ".log") }'
}
export -f run_one
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c "run_one {} $runs"
