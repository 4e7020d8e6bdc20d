#!/usr/bin/env bash
# The main job: HALO against the flat fan-out on an emulated 4-node cluster, in one
# process (ranks as threads, link emulation on). No cluster needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo run --release --quiet -- bench -i 50 -x 5 "$@"
