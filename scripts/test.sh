#!/usr/bin/env bash
# Installs what the tests need, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
