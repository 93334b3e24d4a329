#!/usr/bin/env bash
# Simulated requests per wall second (criterion; see benches/simulator.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench simulator -- "$@"
