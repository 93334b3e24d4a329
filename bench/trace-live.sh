#!/usr/bin/env bash
# One trace, replayed twice: in the simulator on an aged nvme-p4500 (write-through, as
# the emulated backend runs it) and live, by fio, against the server's emulated backend
# of the same preset. A generated MSR trace holds four volumes (one per tenant: Poisson
# arrivals at RATE IOPS each, 70 % reads, 4-64 KiB, offsets within the tenant's 2 GiB);
# the simulator replays volume i for tenant i at its original timing, and fio replays
# `ioshare trace convert --volume i --to fio3` of it against export i (ioengine=nbd,
# read_iolog with iodepth 256 so that it keeps the trace's arrivals, one job per tenant,
# all at once). Prints per tenant MB/s, IOPS and p99
# latency side by side, and the live/sim ratio. Policy POLICY (none).
# (Times are FILETIME from 1e15, offsets printed with %.0f: awk's %d stops at 2^31.)
# Usage: RUNTIME=20 RATE=500 POLICY=none bench/trace-live.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-20}
RATE=${RATE:-500}
POLICY=${POLICY:-none}
source bench/common.sh
install_tools fio:fio nbdinfo:libnbd-bin
cargo build --release --quiet
bin=$PWD/target/release/ioshare
dir=$(mktemp -d)
shm=${EMULATED_DIR:-/dev/shm}
img=$shm/ioshare-trace-live.img
# The server marks an image it created (.NAME.ioshare) and will not create it again empty
# while the mark is there: both go.
trap 'stop_server; rm -rf "$dir" "$img" "$shm/.ioshare-trace-live.img.ioshare"' EXIT
# The trace: RUNTIME + 1 seconds of four volumes.
awk -v secs="$((RUNTIME + 1))" -v rate="$RATE" 'BEGIN {
    srand(11); t0 = 1e15
    for (v = 0; v < 4; v++) { next_t[v] = 0 }
    # merge four Poisson streams in time order
    while (1) {
        best = -1
        for (v = 0; v < 4; v++) if (best < 0 || next_t[v] < next_t[best]) best = v
        if (next_t[best] > secs * 1e7) break
        op = (rand() < 0.7) ? "Read" : "Write"
        size = 4096 * (1 + int(rand() * 16))
        off = int(rand() * (524288 - 16)) * 4096
        printf "%.0f,host,%d,%s,%.0f,%d,0\n", t0 + next_t[best], best, op, off, size
        next_t[best] += int(-log(1 - rand()) * 1e7 / rate)
    }
}' >"$dir/t.csv"
device='model = "ssd", preset = "nvme-p4500", precondition = "aged", capacity_gib = 16, write_buffer_mib = 0'
{
    echo "name = \"trace-live\""
    echo "seed = 1"
    echo "duration_s = $RUNTIME"
    echo "warmup_s = 2"
    echo "policies = [\"$POLICY\"]"
    echo "[device]"
    echo "${device//, /$'\n'}"
    for i in 0 1 2 3; do
        echo "[[tenant]]"
        echo "name = \"t$((i + 1))\""
        echo "offset = \"$((i * 2))g\""
        echo "size = \"2g\""
        echo "workload = { trace = \"t.csv\", select = { disk = $i } }"
    done
} >"$dir/sim.toml"
"$bin" sim "$dir/sim.toml" --out "$dir/sim" -q >/dev/null
sock=$dir/s.sock
{
    echo "[server]"
    echo "unix = \"$sock\""
    echo "interval_s = 0"
    echo "queue_depth = 32"
    echo "policy = \"$POLICY\""
    echo "[backend]"
    echo "kind = \"emulated\""
    echo "path = \"$img\""
    echo "device = { $device }"
    for i in 0 1 2 3; do
        echo "[[tenant]]"
        echo "name = \"t$((i + 1))\""
        echo "offset = \"$((i * 2))g\""
        echo "size = \"2g\""
    done
} >"$dir/serve.toml"
"$bin" serve "$dir/serve.toml" --out "$dir/live" 2>"$dir/serve.log" &
wait_for_export "nbd+unix:///t1?socket=$sock" "$dir/serve.log"
pids=()
for i in 0 1 2 3; do
    "$bin" trace convert "$dir/t.csv" "$dir/t$i.iolog" --to fio3 --volume "$i" 2>/dev/null
    fio --name="t$((i + 1))" --ioengine=nbd "--uri=nbd+unix:///t$((i + 1))?socket=$sock" \
        --read_iolog="$dir/t$i.iolog" --iodepth=256 --runtime="$RUNTIME" --ramp_time=2 --minimal \
        >"$dir/fio-$i.out" &
    pids+=($!)
done
wait "${pids[@]}"
stop_server
echo "# $(date -u +%F), $(nproc) CPUs, $(fio --version); $RUNTIME s, $RATE IOPS a tenant, policy $POLICY"
echo "| tenant | sim MB/s | live MB/s | live/sim | sim IOPS | live IOPS | sim p50 / p99 | live p50 / p99 (server) | live p99 (fio) |"
echo "|---|---|---|---|---|---|---|---|---|"
for i in 0 1 2 3; do
    # terse v3: read KiB/s 7, read IOPS 8, write KiB/s 48, write IOPS 49; completion
    # latency percentiles (µs) of reads in 18-37, of writes in 59-78
    live=$(awk -F';' '$1 == 3 && NF > 80 {
        for (f = 18; f <= 37; f++) { split($f, kv, "="); if (kv[1] == "99.000000%") r = kv[2] }
        for (f = 59; f <= 78; f++) { split($f, kv, "="); if (kv[1] == "99.000000%") w = kv[2] }
        p = (r > w) ? r : w
        printf "%.1f %.0f %.2f", ($7 + $48) * 1024 / 1e6, $8 + $49, p / 1000
    }' "$dir/fio-$i.out")
    # The simulator's and the server's own figures (arrival to completion, from results.json)
    lat() {
        python3 - "$1" "$i" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["runs"][0]["tenants"][int(sys.argv[2])]
l = t["latency_us"]
print(f'{t["bandwidth_bytes_per_s"] / 1e6:.1f} {t["iops"]:.0f} {l["p50"] / 1000:.2f}/{l["p99"] / 1000:.2f}')
PY
    }
    read -r smb siops slat <<<"$(lat "$dir/sim/results.json")"
    read -r _ _ llat <<<"$(lat "$dir/live/results.json")"
    read -r lmb liops lp99 <<<"$live"
    ratio=$(awk -v a="$lmb" -v b="$smb" 'BEGIN { printf "%.3f", a / b }')
    echo "| t$((i + 1)) | $smb | $lmb | $ratio | $siops | $liops | $slat ms | $llat ms | $lp99 ms |"
done
