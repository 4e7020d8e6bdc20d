#!/usr/bin/env bash
# The main job: HALO against the flat fan-out on an emulated 4-node cluster, in one
# process (ranks as threads, link emulation on). No cluster needed.
# --scale 100: every emulated time x100, so that the modelled network stands out of the
# 16 threads' own processor time on a small machine. At the tool's default (x20) on 2
# cores that time is as large as the network's and hides the topology: halo / flat 1.13x
# at 8 B against the simulator's 1.73x; at x100 1.55x, at x400 1.61x (docs/bench/JOURNAL.md,
# "The main job"). --rounds 3: every size measured in three rounds, the implementations in
# rotated order, the median round counting (one 50-call run per column moved a size by
# up to 7%). It takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo run --release --quiet -- bench -i 20 -x 2 --rounds 3 --scale 100 "$@"
