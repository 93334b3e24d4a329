#!/usr/bin/env bash
# `ioshare govern` on real cgroups (v1 blkio), against what a container host has today.
#
# Weights: four cgroups with weights 100:50:25:10 (WEIGHTS), one fio each (libaio,
# O_DIRECT, 4 KiB, iodepth 32, RAMP s not counted then RUNTIME s) on a loop device
# (direct I/O) over a file on this machine's disk; random read, random write and 50/50,
# and MCFQ's fileserver-like mix (`fileserver`: 72 KiB random, two writes to a read, the
# Filebench fileserver's figures in MCFQ's Table 3) with weights 10:7:4:1
# (FILESERVER_WEIGHTS) (PATTERNS); under no control (`none`), the kernel's BFQ with the weights (`bfq`,
# blkio.bfq.weight, where the kernel has it), `io.max`-style static limits at the
# weights' split (`static`: govern with allocator "static"), `govern` (the default SSD
# cost model) and `calibrated` (govern with the loop device's model from `ioshare
# calibrate`, fitted once into $DIR/loop-cost.toml); `feedback` (in MODES to run it):
# govern with MoTS' feedback on the split (`allocator = "feedback"`). Each pattern's
# modes run in turn, ROUNDS times (the disk under a virtual machine changes its speed
# from minute to minute: each mode is compared with the `none` of its own round).
# Prints per cgroup IOPS, the total against that `none`, and the share error of IOPS
# (every cgroup runs the same job: IOPS is device time) against the weights: mean over
# the cgroups of |share - ideal| / ideal.
#
# Noisy neighbour (NOISY=1), in blk-iocost's terms: a latency-sensitive reader (4 KiB
# random reads, iodepth 4) alone, then beside a cgroup flooding 128 KiB writes at
# iodepth 32, the reader ten times the writer's weight (NOISY_WEIGHTS), under each mode: isolation (the reader's IOPS against
# alone), latency impact (its p99 against alone) and work conservation (bytes moved by
# both against `none`). Mode `slo` (noisy neighbour only; in MODES to run it): govern
# with the reader holding an SLO from its run alone — its IOPS alone, 4 KiB, within
# 1.1× its p99 alone (the 10 % latency-impact target).
#
#   bench/govern.sh                      # the whole matrix, about 15 minutes
#   RUNTIME=5 ROUNDS=1 PATTERNS=randread MODES="none govern" NOISY=0 bench/govern.sh
#
# Needs root and cgroup v1's blkio mount at /sys/fs/cgroup/blkio.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-10}
RAMP=${RAMP:-3}
ROUNDS=${ROUNDS:-2}
PATTERNS=${PATTERNS:-"randread randwrite randrw fileserver"}
MODES=${MODES:-"none bfq static govern calibrated"}
WEIGHTS=${WEIGHTS:-"100 50 25 10"}
FILESERVER_WEIGHTS=${FILESERVER_WEIGHTS:-"10 7 4 1"}
NOISY=${NOISY:-1}
NOISY_WEIGHTS=${NOISY_WEIGHTS:-"10 1"}
SIZE=${SIZE:-2g}
DIR=$(realpath -m "${BENCH_DIR:-target/govern-bench}")
source bench/common.sh
install_tools fio:fio
[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
V1=/sys/fs/cgroup/blkio
[ -e $V1/blkio.throttle.read_iops_device ] || { echo "needs cgroup v1 blkio at $V1" >&2; exit 1; }
# IOSHARE_BIN: another build of ioshare to run (an A/B of two versions of the governor);
# GOVERN_EXTRA: lines added to the [govern] table (`target_us = 250`).
if [ -n "${IOSHARE_BIN:-}" ]; then
    BIN=$(realpath "$IOSHARE_BIN")
else
    cargo build --release --quiet
    BIN=$PWD/target/release/ioshare
fi
mkdir -p "$DIR"
rm -f "$DIR"/*.json "$DIR"/*.log
img=$DIR/disk.img
[ -f "$img" ] || { truncate -s "$SIZE" "$img"; dd if=/dev/urandom of="$img" bs=1M count=$(( $(stat -c %s "$img") >> 20 )) conv=notrunc status=none; }
loop=$(losetup -f --show --direct-io=on "$img")
name=$(basename "$loop")
sched_default=$(sed 's/.*\[\(.*\)\].*/\1/' /sys/block/$name/queue/scheduler)
cgs=()
cleanup() {
    echo "$sched_default" >/sys/block/$name/queue/scheduler 2>/dev/null || true
    for c in "${cgs[@]}"; do rmdir "$c" 2>/dev/null || true; done
    losetup -d "$loop" 2>/dev/null || true
}
trap cleanup EXIT
for n in 1 2 3 4; do
    mkdir -p "$V1/ioshare-bench-$n"
    cgs+=("$V1/ioshare-bench-$n")
done

# run MODE TAG "w1 w2 ..." "fio args 1" "fio args 2" ...: one fio per cgroup at once,
# under MODE; results in $DIR/TAG-cN.json.
run() {
    local mode=$1 tag=$2 weights=($3) i=0 pids=() gpid=
    shift 3
    echo "$sched_default" >/sys/block/$name/queue/scheduler
    if [ "$mode" = bfq ]; then
        echo bfq >/sys/block/$name/queue/scheduler
        for w in "${weights[@]}"; do
            i=$((i + 1))
            echo "$w" >"$V1/ioshare-bench-$i/blkio.bfq.weight"
        done
    fi
    if [ "$mode" != none ] && [ "$mode" != bfq ]; then
        local alloc=weights cost= slo1=
        [ "$mode" = slo ] && slo1=${SLO_LINE:-}
        [ "$mode" = static ] && alloc=static
        [ "$mode" = feedback ] && alloc=feedback
        [ "$mode" = calibrated ] && cost="cost_device = \"$DIR/loop-cost.toml\""
        {
            printf '[govern]\ndevice = "%s"\nallocator = "%s"\nstate = "%s/state.json"\n%s\n%s\n' "$loop" "$alloc" "$DIR" "$cost" "${GOVERN_EXTRA:-}"
            i=0
            for w in "${weights[@]}"; do
                i=$((i + 1))
                printf '[[tenant]]\nname = "c%d"\ncgroup = "%s/ioshare-bench-%d"\nweight = %s\n' $i "$V1" $i "$w"
                if [ $i = 1 ] && [ -n "$slo1" ]; then printf '%s\n' "$slo1"; fi
            done
        } >"$DIR/govern.toml"
        "$BIN" govern "$DIR/govern.toml" --report-every 1 2>"$DIR/$tag.log" &
        gpid=$!
        sleep 0.3
    fi
    i=0
    for args in "$@"; do
        i=$((i + 1))
        sh -c "echo \$\$ > $V1/ioshare-bench-$i/cgroup.procs; exec fio --name=c$i --filename=$loop --direct=1 --ioengine=libaio $args --time_based --ramp_time=$RAMP --runtime=$RUNTIME --output-format=json --output=$DIR/$tag-c$i.json" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    if [ -n "$gpid" ]; then kill "$gpid"; wait "$gpid" || true; fi
}

have_bfq() { grep -qw bfq /sys/block/$name/queue/scheduler; }

if [[ " $MODES " == *" calibrated "* ]] && [ ! -f "$DIR/loop-cost.toml" ]; then
    echo "calibrating the loop device (about a minute)" >&2
    "$BIN" calibrate "$loop" --destroy-data --no-check --quiet --out "$DIR/loop-cost.toml" >/dev/null
fi

for round in $(seq 1 "$ROUNDS"); do
    for pattern in $PATTERNS; do
        for mode in $MODES; do
            if [ "$mode" = bfq ] && ! have_bfq; then continue; fi
            if [ "$mode" = slo ]; then continue; fi
            jobs=()
            weights=$WEIGHTS
            args="--rw=$pattern --bs=4k --iodepth=32"
            if [ "$pattern" = fileserver ]; then
                weights=$FILESERVER_WEIGHTS
                args="--rw=randrw --rwmixread=33 --bs=72k --iodepth=32"
            fi
            for _ in $weights; do jobs+=("$args"); done
            echo "round $round: $pattern under $mode" >&2
            run "$mode" "w-$round-$pattern-$mode" "$weights" "${jobs[@]}"
        done
    done
done

if [ "$NOISY" = 1 ]; then
    reader="--rw=randread --bs=4k --iodepth=4"
    writer="--rw=write --bs=128k --iodepth=32"
    echo "noisy neighbour: the reader alone" >&2
    run none "n-alone" "1" "$reader"
    SLO_LINE=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["jobs"][0]["read"]
p99 = r["clat_ns"]["percentile"]["99.000000"] / 1e3
print("slo = { iops = %d, size = \"4k\", rt_us = %d }" % (r["iops"], 1.1 * p99))
' "$DIR/n-alone-c1.json")
    echo "noisy neighbour: the reader's SLO under slo: $SLO_LINE" >&2
    for mode in $MODES; do
        if [ "$mode" = bfq ] && ! have_bfq; then continue; fi
        echo "noisy neighbour under $mode" >&2
        run "$mode" "n-$mode" "$NOISY_WEIGHTS" "$reader" "$writer"
    done
fi

echo "# $(uname -r), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), loop device over $(df --output=source "$DIR" | tail -1)"
python3 - "$DIR" "$ROUNDS" "$PATTERNS" "$MODES" "$WEIGHTS" "$NOISY" "$FILESERVER_WEIGHTS" <<'PY'
import json, os, sys
d, rounds, patterns, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
weights, noisy = [float(w) for w in sys.argv[5].split()], sys.argv[6] == "1"
fs_weights = [float(w) for w in sys.argv[7].split()]
def job(tag, i):
    f = f"{d}/{tag}-c{i}.json"
    return json.load(open(f))["jobs"][0] if os.path.exists(f) else None
print(f"{'round':<5} {'pattern':<10} {'mode':<7} " + " ".join(f"{'c%d IOPS' % (i + 1):>9}" for i in range(len(weights))) + f" {'total':>8} {'vs none':>7} {'share err':>9}")
for r in range(1, rounds + 1):
    for p in patterns:
        base = None
        ws = fs_weights if p == "fileserver" else weights
        ideal = [w / sum(ws) for w in ws]
        for m in modes:
            jobs = [job(f"w-{r}-{p}-{m}", i + 1) for i in range(len(ws))]
            if not all(jobs):
                continue
            iops = [j["read"]["iops"] + j["write"]["iops"] for j in jobs]
            total = sum(iops)
            if m == "none":
                base = total
            err = sum(abs(x / total - s) / s for x, s in zip(iops, ideal)) / len(iops) if total else float("nan")
            vs = f"{total / base:.2f}x" if base else "-"
            print(f"{r:<5} {p:<10} {m:<7} " + " ".join(f"{x:>9.0f}" for x in iops) + f" {total:>8.0f} {vs:>7} {100 * err:>8.1f}%")
if noisy and job("n-alone", 1):
    alone = job("n-alone", 1)["read"]
    a_iops, a_p99 = alone["iops"], alone["clat_ns"]["percentile"]["99.000000"] / 1e3
    print(f"\nnoisy neighbour: reader alone {a_iops:.0f} IOPS, p99 {a_p99:.0f} us")
    print(f"{'mode':<7} {'reader IOPS':>11} {'p99 us':>8} {'writer MB/s':>11} {'isolation':>9} {'lat impact':>10} {'work cons':>9}")
    base = None
    for m in modes:
        r, w = job(f"n-{m}", 1), job(f"n-{m}", 2)
        if not (r and w):
            continue
        iops, p99 = r["read"]["iops"], r["read"]["clat_ns"]["percentile"]["99.000000"] / 1e3
        moved = r["read"]["bw_bytes"] + w["write"]["bw_bytes"]
        if m == "none":
            base = moved
        wc = f"{100 * moved / base:.0f}%" if base else "-"
        print(f"{m:<7} {iops:>11.0f} {p99:>8.0f} {w['write']['bw_bytes'] / 1e6:>11.1f} {100 * iops / a_iops:>8.1f}% {100 * (p99 / a_p99 - 1):>9.1f}% {wc:>9}")
PY
