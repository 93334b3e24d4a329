#!/usr/bin/env bash
# Time to precondition (age) a 64 GiB drive of each SSD preset: sequential fill, then one
# logical space of random overwrites with greedy GC. Prints one line per preset.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
for preset in sata-840pro nvme-p4500; do
    for run in 1 2 3; do
        ./target/release/ioshare precondition --preset "$preset" --capacity-gib "${CAPACITY_GIB:-64}"
    done
done
