#!/usr/bin/env bash
# `ioshare govern` on real cgroups (v1 blkio), first cut of the container-host bench:
# four cgroups with weights 100:50:25:10 (WEIGHTS), one fio each (libaio, O_DIRECT,
# 4 KiB, iodepth 32) on a loop device (direct I/O) over a file on this machine's disk,
# random read, random write and 50/50 (PATTERNS), under: no control (`none`), the
# kernel's BFQ with the weights (`bfq`, blkio.bfq.weight, where the kernel has it),
# `io.max`-style static limits at the weights' split (`govern` with allocator
# "static"), and `govern`. Prints per cgroup IOPS, the total against `none`, and the
# share error of IOPS (4 KiB requests of one kind: IOPS is device time here) against the
# weights: mean over cgroups of |share - ideal| / ideal.
#
#   bench/govern.sh                      # 10 s per cell
#   RUNTIME=5 PATTERNS=randread MODES="none govern" bench/govern.sh
#
# Needs root and cgroup v1's blkio mount at /sys/fs/cgroup/blkio.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-10}
PATTERNS=${PATTERNS:-"randread randwrite randrw"}
MODES=${MODES:-"none bfq static govern"}
WEIGHTS=${WEIGHTS:-"100 50 25 10"}
SIZE=${SIZE:-2g}
DIR=$(realpath -m "${BENCH_DIR:-target/govern-bench}")
source bench/common.sh
install_tools fio:fio
[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
[ -e /sys/fs/cgroup/blkio/blkio.throttle.read_iops_device ] || { echo "needs cgroup v1 blkio at /sys/fs/cgroup/blkio" >&2; exit 1; }
cargo build --release --quiet
BIN=$PWD/target/release/ioshare
mkdir -p "$DIR"
img=$DIR/disk.img
[ -f "$img" ] || { truncate -s "$SIZE" "$img"; dd if=/dev/urandom of="$img" bs=1M count=$(( $(stat -c %s "$img") >> 20 )) conv=notrunc status=none; }
loop=$(losetup -f --show --direct-io=on "$img")
name=$(basename "$loop")
cgs=()
cleanup() {
    for c in "${cgs[@]}"; do rmdir "$c" 2>/dev/null || true; done
    losetup -d "$loop" 2>/dev/null || true
}
trap 'stop_server; cleanup' EXIT
n=0
for w in $WEIGHTS; do
    n=$((n + 1))
    c=/sys/fs/cgroup/blkio/ioshare-bench-$n
    mkdir -p "$c"
    cgs+=("$c")
done
sched_default=$(sed 's/.*\[\(.*\)\].*/\1/' /sys/block/$name/queue/scheduler)

# cell MODE PATTERN: runs the four fio clients; prints "iops1 iops2 ..."
cell() {
    local mode=$1 pattern=$2 pids=() i=0 gpid=
    echo "$sched_default" >/sys/block/$name/queue/scheduler
    if [ "$mode" = bfq ]; then
        echo bfq >/sys/block/$name/queue/scheduler
        for w in $WEIGHTS; do
            i=$((i + 1))
            echo "$w" >"/sys/fs/cgroup/blkio/ioshare-bench-$i/blkio.bfq.weight" 2>/dev/null || true
        done
    fi
    if [ "$mode" = static ] || [ "$mode" = govern ]; then
        local alloc=weights
        [ "$mode" = static ] && alloc=static
        {
            echo "[govern]"
            echo "device = \"$loop\""
            echo "allocator = \"$alloc\""
            echo "state = \"$DIR/state.json\""
            i=0
            for w in $WEIGHTS; do
                i=$((i + 1))
                printf '[[tenant]]\nname = "c%d"\ncgroup = "/sys/fs/cgroup/blkio/ioshare-bench-%d"\nweight = %d\n' $i $i $w
            done
        } >"$DIR/govern.toml"
        "$BIN" govern "$DIR/govern.toml" --report-every 0 2>"$DIR/govern-$mode-$pattern.log" &
        gpid=$!
        sleep 0.5
    fi
    i=0
    for w in $WEIGHTS; do
        i=$((i + 1))
        sh -c "echo \$\$ > /sys/fs/cgroup/blkio/ioshare-bench-$i/cgroup.procs; exec fio --name=c$i --filename=$loop --direct=1 --ioengine=libaio --rw=$pattern --bs=4k --iodepth=32 --time_based --runtime=$RUNTIME --output-format=json --output=$DIR/$mode-$pattern-c$i.json" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    if [ -n "$gpid" ]; then kill "$gpid"; wait "$gpid" || true; fi
    echo "$sched_default" >/sys/block/$name/queue/scheduler
}

for pattern in $PATTERNS; do
    for mode in $MODES; do
        if [ "$mode" = bfq ] && ! grep -qw bfq /sys/block/$name/queue/scheduler; then continue; fi
        cell "$mode" "$pattern"
    done
done

python3 - "$DIR" "$PATTERNS" "$MODES" "$WEIGHTS" <<'PY'
import json, os, sys
d, patterns, modes, weights = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), [float(w) for w in sys.argv[4].split()]
ideal = [w / sum(weights) for w in weights]
print(f"{'pattern':<10} {'mode':<7} " + " ".join(f"{'c%d IOPS' % (i + 1):>9}" for i in range(len(weights))) + f" {'total':>8} {'vs none':>7} {'share err':>9}")
for p in patterns:
    base = None
    for m in modes:
        files = [f"{d}/{m}-{p}-c{i + 1}.json" for i in range(len(weights))]
        if not all(os.path.exists(f) for f in files):
            continue
        iops = []
        for f in files:
            j = json.load(open(f))["jobs"][0]
            iops.append(j["read"]["iops"] + j["write"]["iops"])
        total = sum(iops)
        if m == "none":
            base = total
        err = sum(abs(x / total - s) / s for x, s in zip(iops, ideal)) / len(iops) if total else float("nan")
        vs = f"{total / base:.2f}x" if base else "-"
        print(f"{p:<10} {m:<7} " + " ".join(f"{x:>9.0f}" for x in iops) + f" {total:>8.0f} {vs:>7} {100 * err:>8.1f}%")
PY
