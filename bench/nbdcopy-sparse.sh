#!/usr/bin/env bash
# A mostly empty export copied by nbdcopy: with block status (base:allocation, the
# default: only what was written is read) against --no-extents (every byte read, as a
# server without block status makes every client do), ROUNDS rounds each, in one run.
# A SIZE image (sparse, on a real file system under target/) with WRITTEN MiB written at
# 100 MiB; the copy goes to a sparse file beside it and is compared with the image.
# Prints each copy's wall time and the ratio of the medians.
# Usage: SIZE=1g WRITTEN=10 ROUNDS=3 bench/nbdcopy-sparse.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-1g}
WRITTEN=${WRITTEN:-10}
ROUNDS=${ROUNDS:-3}
source bench/common.sh
install_tools nbdcopy:libnbd-bin qemu-io:qemu-utils
cargo build --release --quiet
bin=$PWD/target/release/ioshare
mkdir -p target
dir=$(mktemp -d -p target)
trap 'stop_server; rm -rf "$dir"' EXIT
cat >"$dir/serve.toml" <<TOML
[server]
unix = "s.sock"
interval_s = 0
[[tenant]]
name = "vm1"
file = "vm1.img"
create = true
size = "$SIZE"
TOML
"$bin" serve "$dir/serve.toml" 2>"$dir/serve.log" &
uri="nbd+unix:///vm1?socket=$dir/s.sock"
wait_for_export "$uri" "$dir/serve.log"
qemu-io -f raw -c "write -P 0x5a 100M ${WRITTEN}M" "$uri" >/dev/null
# Nothing of the write still going to the disk while the copies are timed.
sync
# The copy's wall time in seconds (bash's own timer: no process around it).
time_copy() {
    rm -f "$dir/copy.img"
    local TIMEFORMAT=%R
    { time nbdcopy "$@" "$uri" "$dir/copy.img" 2>/dev/null; } 2>&1
}
with=() without=()
for r in $(seq "$ROUNDS"); do
    with+=("$(time_copy)")
    without+=("$(time_copy --no-extents)")
    printf 'round %d: block status %.3f s, --no-extents %.3f s\n' "$r" "${with[-1]}" "${without[-1]}"
done
# Both ways copy every byte (checked once each, outside the timing).
for how in "" --no-extents; do
    rm -f "$dir/copy.img"
    nbdcopy $how "$uri" "$dir/copy.img"
    cmp -s "$dir/copy.img" "$dir/vm1.img" || { echo "the copy ($how) differs" >&2; exit 1; }
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
mw=$(median "${with[@]}")
mo=$(median "${without[@]}")
printf 'median: block status %.3f s, --no-extents %.3f s: %.1fx faster (%s image, %s MiB written, %s rounds)\n' \
    "$mw" "$mo" "$(echo "$mo / $mw" | bc -l)" "$SIZE" "$WRITTEN" "$ROUNDS"
