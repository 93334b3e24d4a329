#!/usr/bin/env bash
# Other tenants' latency while tenants come and go through the control socket: the
# server runs four tenants (weights 100:50:25:10, policy sfq by default), each read by
# its own fio (ioengine=nbd, 4 KiB random reads, iodepth 16); in alternating windows of
# RUNTIME seconds either nothing else happens ("quiet") or a loop of `ioshare ctl`
# requests runs on one control connection, a cycle every CYCLE_MS ("changes"): a tenant
# added (a new image created), its weight, SLO and limit set, drained, removed, resumed,
# the `tenants` list and the `metrics` figures read (9 requests a cycle). Prints each fio tenant's p99 and IOPS per window, and the
# changes window's p99 against the quiet windows' around it (ROUNDS pairs, quiet first).
#
#   bench/ctl-change.sh                   # 4 rounds of 10 s windows
#   RUNTIME=5 ROUNDS=2 POLICY=feedbac bench/ctl-change.sh
#
# Environment: RUNTIME (10), ROUNDS (4), POLICY (sfq), CYCLE_MS (100), CACHE (writeback: the images are
# in the page cache, so the engine, not the disk, sets the latency — where a stall of
# the engine thread would show), BENCH_DIR (target/ctl-change).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-4}
POLICY=${POLICY:-sfq}
CACHE=${CACHE:-writeback}
CYCLE_MS=${CYCLE_MS:-100}
DIR=$(realpath -m "${BENCH_DIR:-target/ctl-change}")

source bench/common.sh
install_tools fio:fio nbdinfo:libnbd-bin
cargo build --release --quiet
BIN=$PWD/target/release/ioshare
rm -rf "$DIR"
mkdir -p "$DIR"
SOCK=$DIR/nbd.sock
CTL=$DIR/ctl.sock

{
    echo "[server]"
    echo "unix = \"$SOCK\""
    echo "control = \"$CTL\""
    echo "interval_s = 0"
    echo "policy = \"$POLICY\""
    echo "[backend]"
    echo "cache = \"$CACHE\""
    n=0
    for w in 100 50 25 10; do
        n=$((n + 1))
        printf '[[tenant]]\nname = "t%d"\nfile = "t%d.img"\nsize = "256m"\ncreate = true\nweight = %d\n' $n $n $w
    done
} >"$DIR/serve.toml"
"$BIN" serve "$DIR/serve.toml" 2>"$DIR/serve.log" &
wait_for_export "nbd+unix:///t1?socket=$SOCK" "$DIR/serve.log"
# The images hold data, read once so every window finds it cached alike.
for n in 1 2 3 4; do
    fio --name=fill --ioengine=nbd --uri="nbd+unix:///t$n?socket=$SOCK" --rw=write \
        --bs=1m --size=256m --iodepth=4 --output=/dev/null
done

# window KIND ROUND: four fio clients for RUNTIME s; with KIND=changes, the ctl loop
# beside them. Writes one JSON per tenant and the number of ctl requests answered.
window() {
    local kind=$1 round=$2 pids=() n
    for n in 1 2 3 4; do
        fio --name="t$n" --ioengine=nbd --uri="nbd+unix:///t$n?socket=$SOCK" \
            --rw=randread --bs=4k --iodepth=16 --size=256m --time_based \
            --runtime="$RUNTIME" --output-format=json \
            --output="$DIR/$kind-$round-t$n.json" &
        pids+=($!)
    done
    local asked=0
    if [ "$kind" = changes ]; then
        asked=$(python3 - "$CTL" "$RUNTIME" "$round" "$CYCLE_MS" <<'PY'
import json, socket, sys, time
path, runtime, rnd, cycle = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4]) / 1000
s = socket.socket(socket.AF_UNIX)
s.connect(path)
f = s.makefile("rw")
json.loads(f.readline())
asked = 0
def ask(command, **arguments):
    global asked
    f.write(json.dumps({"execute": command, "arguments": arguments}) + "\n")
    f.flush()
    answer = json.loads(f.readline())
    if "error" in answer:
        sys.exit(f"{command} {arguments}: {answer['error']}")
    asked += 1
end = time.monotonic() + runtime
k = 0
while time.monotonic() < end:
    start = time.monotonic()
    k += 1
    name = f"x{rnd}-{k}"
    ask("add-tenant", name=name, file=f"{name}.img", size="16m", create=True, weight=5)
    ask("set-tenant", name=name, weight=20, limit_iops=3000)
    ask("set-tenant", name=name, slo={"iops": 500, "size": "4k", "rt_us": 5000})
    ask("drain-tenant", name=name)
    ask("tenants")
    ask("metrics")
    ask("remove-tenant", name=name)
    ask("resume-tenant", name=name)
    ask("remove-tenant", name=name)
    time.sleep(max(0.0, cycle - (time.monotonic() - start)))
print(asked)
PY
)
    fi
    for p in "${pids[@]}"; do wait "$p"; done
    echo "$asked" >"$DIR/$kind-$round.asked"
}

for r in $(seq "$ROUNDS"); do
    window quiet "$r"
    window changes "$r"
done
stop_server

python3 - "$DIR" "$ROUNDS" "$RUNTIME" <<'PY'
import json, sys, statistics
d, rounds, runtime = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def read(kind, r, n):
    j = json.load(open(f"{d}/{kind}-{r}-t{n}.json"))["jobs"][0]["read"]
    return j["clat_ns"]["percentile"]["99.000000"] / 1000, j["iops"]
print(f"{'round':>5} {'window':>8} {'ctl req/s':>9} " + " ".join(f"{'t%d p99 µs' % n:>11} {'IOPS':>7}" for n in range(1, 5)))
ratios = {n: [] for n in range(1, 5)}
for r in range(1, rounds + 1):
    for kind in ("quiet", "changes"):
        asked = int(open(f"{d}/{kind}-{r}.asked").read())
        cells = []
        for n in range(1, 5):
            p99, iops = read(kind, r, n)
            cells.append(f"{p99:>11.0f} {iops:>7.0f}")
        print(f"{r:>5} {kind:>8} {asked / runtime:>9.1f} " + " ".join(cells))
    for n in range(1, 5):
        quiet = [read("quiet", q, n)[0] for q in (r, r + 1) if q <= rounds]
        ratios[n].append(read("changes", r, n)[0] / statistics.mean(quiet))
print()
print("p99 in the changes window / mean p99 of the quiet windows around it (median over rounds):")
print("  " + "  ".join(f"t{n} {statistics.median(ratios[n]):.3f}" for n in range(1, 5)))
PY
