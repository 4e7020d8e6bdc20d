#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time and fails on any crash,
# panic, leak or timeout (libFuzzer's exit status). CI runs it after the tests.
#
#   bash scripts/fuzz.sh                 # every target, FUZZ_SECONDS (20) each
#   FUZZ_SECONDS=300 bash scripts/fuzz.sh card topology
#
# Each target starts from its committed seeds (fuzz/seeds/TARGET) in a scratch corpus
# (nothing is written into the repository); a crashing input is kept in
# fuzz/artifacts/TARGET/ and the script prints how to replay it.
#
# Toolchain: cargo-fuzz needs nightly compiler flags (-Z sanitizer, sancov). A fresh
# machine has only the stable toolchain, so unless rustc is a nightly this sets
# RUSTC_BOOTSTRAP=1 (stable rustc ships the sanitizer runtimes). cargo-fuzz is
# installed from crates.io when missing (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-20}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(topology card c_abi cli bootstrap_hello call)
fi
start=$(date +%s)

if ! rustc --version | grep -q nightly; then
  export RUSTC_BOOTSTRAP=1
fi
export CARGO_INCREMENTAL=0
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked --version 0.13.2
fi

# Address sanitizer, debug assertions and overflow checks on (cargo-fuzz's defaults).
# --dev (no optimisation) builds in about half the CPU time of the optimised build but
# runs 10-50 times fewer inputs a second: FUZZ_RELEASE=1 for long runs.
build=(--dev)
if [ "${FUZZ_RELEASE:-0}" = 1 ]; then build=(); fi
echo "== building the fuzz targets ($(rustc --version))"
(cd fuzz && cargo fuzz build "${build[@]}")
built=$(date +%s)

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
summary=()
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  echo "== fuzz $t for ${seconds}s"
  log="$scratch/$t.log"
  # -rss_limit_mb: a leak or an unbounded allocation is a failure too.
  # -timeout: one input that runs 10 s is a hang.
  if (cd fuzz && cargo fuzz run "${build[@]}" "$t" "$scratch/$t" "seeds/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1) \
      >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "   ok: $runs inputs, no crash"
    summary+=("$t: $runs inputs, 0 crashes")
  else
    failed+=("$t")
    tail -n 60 "$log"
    echo "   FAILED: the input is in fuzz/artifacts/$t/; replay with"
    echo "   (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run ${build[*]} $t artifacts/$t/<file>)"
    summary+=("$t: CRASH")
  fi
done

echo "== fuzz summary (build $((built - start)) s, total $(( $(date +%s) - start )) s)"
printf '   %s\n' "${summary[@]}"
echo "fuzz: ${#targets[@]} targets, ${#failed[@]} crashed"
[ ${#failed[@]} -eq 0 ]
