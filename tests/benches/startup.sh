#!/usr/bin/env bash
# Whole-process start-up of the clawcage binary, beside `cat` of the same file in the same run:
# `clawcage --version` (loading the binary, no work), `clawcage call read_file`, `clawcage tools`
# and `clawcage call exec '{"command":"echo hi"}'`,
# each started RUNS times (default 15) with a warm compiled-component cache, median and spread
# printed, interleaved so that machine noise hits every command alike.
#
# Usage: tests/benches/startup.sh [RUNS]   (or `just bench-startup`); builds the release binary,
# or measures CLAWCAGE_BIN when set (e.g. a copy of an earlier build, to compare in one run).
# Where the time goes: `perf record -F 20000 -g` over a loop of starts, on a build that keeps its
# symbols (`CARGO_PROFILE_RELEASE_STRIP=false cargo build --release`).
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-15}
if [[ -n ${CLAWCAGE_BIN:-} ]]; then
  bin=$(realpath "$CLAWCAGE_BIN")
else
  cargo build --release -q -p clawcage-cli
  bin=$PWD/target/release/clawcage
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/workspace" "$scratch/state"
seq 1 100 | sed 's/^/line of the start-up benchmark file /' > "$scratch/workspace/notes.txt"
cd "$scratch/workspace"
export CLAWCAGE_STATE_DIR="$scratch/state"

labels=("cat" "clawcage --version" "clawcage call read_file" "clawcage tools" "clawcage call exec echo hi")
# One function per command, so that arguments with spaces stay whole.
run_command() {
  case $1 in
    0) cat notes.txt ;;
    1) "$bin" --version ;;
    2) "$bin" call read_file '{"path":"notes.txt"}' ;;
    3) "$bin" tools ;;
    4) "$bin" call exec '{"command":"echo hi"}' ;;
  esac
}

# Warm: the first start compiles the components and records what they offer.
for index in "${!labels[@]}"; do
  run_command "$index" > /dev/null
done

declare -A samples
for ((run = 0; run < runs; run++)); do
  for index in "${!labels[@]}"; do
    start=$(date +%s%N)
    run_command "$index" > /dev/null
    end=$(date +%s%N)
    samples[$index]+="$(( (end - start) / 1000 )) "
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
minimum() { tr ' ' '\n' | grep -v '^$' | sort -n | head -1; }
maximum() { tr ' ' '\n' | grep -v '^$' | sort -n | tail -1; }

echo "== whole-process start-up, warm cache, $runs runs each (load: $(cut -d' ' -f1-3 /proc/loadavg))"
base=$(echo "${samples[0]}" | median)
printf "%-28s %10s %10s %10s %8s\n" "command" "median" "min" "max" "vs cat"
for index in "${!labels[@]}"; do
  values=${samples[$index]}
  awk -v label="${labels[$index]}" -v med="$(echo "$values" | median)" \
    -v low="$(echo "$values" | minimum)" -v high="$(echo "$values" | maximum)" -v base="$base" \
    'BEGIN { printf "%-28s %8.1fms %8.1fms %8.1fms %7.1fx\n", label, med / 1000, low / 1000, high / 1000, med / base }'
done
