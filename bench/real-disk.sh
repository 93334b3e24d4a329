#!/usr/bin/env bash
# This machine's disk, measured: `ioshare calibrate` on a new file (measurements, the
# fitted model, the check of the model against the target's characterize matrix), then
# `ioshare characterize` under each kernel scheduler on a loop device (direct I/O) over
# a second file, both in BENCH_DIR (default target/real-disk: put it on the disk to
# measure). Needs root for losetup and the scheduler switch. Files and the loop device
# are removed at the end.
#
#   bench/real-disk.sh
#   SIZE=4g SIZES=4k,64k,1m,16m DURATION=1 bench/real-disk.sh
#
# Environment: SIZE (2g: each file), SIZES (4k,64k,1m,16m: the characterize sizes),
# DURATION (0.5: shortest cell, s), PROBE (1: calibrate's seconds per measurement),
# KERNEL (all), OUT (target/real-disk/out: vda.toml, calibrate.json, the characterize
# files).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-2g}
SIZES=${SIZES:-4k,64k,1m,16m}
DURATION=${DURATION:-0.5}
PROBE=${PROBE:-1}
KERNEL=${KERNEL:-all}
BENCH_DIR=${BENCH_DIR:-target/real-disk}
OUT=${OUT:-$BENCH_DIR/out}
mkdir -p "$BENCH_DIR" "$OUT"
cargo build --release -q
bin=target/release/ioshare
loop=""
cleanup() {
    [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null || true
    rm -f "$BENCH_DIR/cal.img" "$BENCH_DIR/loop.img"
}
trap cleanup EXIT

echo "== calibrate (a new $SIZE file in $BENCH_DIR)"
/usr/bin/time -f "calibrate wall %e s" "$bin" calibrate "$BENCH_DIR/cal.img" --size "$SIZE" \
    --probe-seconds "$PROBE" --check-sizes "$SIZES" --out "$OUT/vda.toml" \
    --json "$OUT/calibrate.json" -q

echo "== characterize under the kernel's schedulers (loop device, direct I/O)"
truncate -s "$SIZE" "$BENCH_DIR/loop.img"
loop=$(losetup --direct-io=on -f --show "$BENCH_DIR/loop.img")
# Written in full first, so reads read data.
dd if=/dev/urandom of="$loop" bs=1M oflag=direct status=none || true
/usr/bin/time -f "characterize wall %e s" "$bin" characterize "$loop" --kernel "$KERNEL" \
    --sizes "$SIZES" --duration "$DURATION" --destroy-data --out "$OUT/kernel" -q
