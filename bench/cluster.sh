#!/usr/bin/env bash
# cluster.sh - one set of promises across three ioshare fronts on one Ceph cluster, live.
#
# A throw-away cluster (bench/ceph-up.sh), three `ioshare serve` fronts with the rbd
# backend, six tenants with weights 1:2:4:1:2:4 whose volumes are spread unevenly over
# the fronts (t1 on all three, t3 and t5 on two, the others on one), one fio client per
# volume (4 KiB random reads, iodepth DEPTH). Half-way, t3 moves its load from front 2
# to front 3 (a demand shift). Three settings, in turn:
#   none     fronts without QoS (FIFO each);
#   rbdqos   librbd's own per-image limit (`rbd_qos_iops_limit`, image metadata): each
#            tenant's weight's share of the cluster's speed under `none`, split evenly
#            over its volumes - what one would set by hand;
#   global   the fronts' exchange ([cluster]): t1 reserves RES of the cluster's speed
#            under `none`, t6 is limited to LIMIT of it.
# Per 1 s window (fio's IOPS logs, each tenant's volumes summed): the global weighted
# share error (against the weights, and in `global` against the mClock split with t1's
# reservation and t6's limit), whether t1 got its reservation, t6's overshoot of its
# limit, and the seconds after the shift until the share error is back under 5 %;
# "settled" is the mean share error from 2/5 of the run on, the shift's window and the
# next aside (the fronts' allocator starts from the nominal capacity and finds the
# cluster's in the first seconds).
#
# Usage: [NUM_OSDS=3] [DEPTH=8] [SECS=24] [RES=0.15] [LIMIT=0.2] [LATENCY_MS=ms]
#        [WINDOWS=1] [KEEP=1] bench/cluster.sh
#   LATENCY_MS sets the fronts' cluster.latency_target_ms (default: the governor's).
#   WINDOWS=1 prints every window's shares; KEEP=1 keeps the logs and configurations.
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_OSDS=${NUM_OSDS:-3}
DEPTH=${DEPTH:-8}
SECS=${SECS:-24}
RES=${RES:-0.15}
LIMIT=${LIMIT:-0.2}
BIN=${IOSHARE:-target/release/ioshare}
[ -x "$BIN" ] || cargo build --release
WORK=$(mktemp -d /tmp/ioshare-cluster.XXXXXX)
export CEPH_DIR=$WORK/c
PIDS=()
stop_fronts() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
cleanup() {
    stop_fronts
    bench/ceph-down.sh >/dev/null 2>&1 || true
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# volume = tenant:front (the image is v-tenant-front)
VOLUMES="t1:1 t1:2 t1:3 t2:1 t3:2 t3:3 t4:3 t5:1 t5:2 t6:2"
WEIGHTS="t1:1 t2:2 t3:4 t4:1 t5:2 t6:4"
IMAGES=$(for v in $VOLUMES; do printf 'v-%s-%s:256 ' "${v%:*}" "${v#*:}"; done)
NUM_OSDS=$NUM_OSDS IMAGES="$IMAGES" bench/ceph-up.sh >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; exit 1; }
CONF=$CEPH_DIR/ceph.conf
export CEPH_CONF=$CONF
for v in $VOLUMES; do   # written once: a never-written image reads nothing from the OSDs
    rbd bench --io-type write --io-size 4M --io-threads 4 --io-total 256M --io-pattern seq \
        "rbd/v-${v%:*}-${v#*:}" >/dev/null 2>&1
done
PORTS=(0 $((17400 + RANDOM % 1000)) $((18400 + RANDOM % 1000)) $((19400 + RANDOM % 1000)))

# front FRONT MODE [RES_IOPS LIMIT_IOPS]: writes front FRONT's configuration
front_config() {
    local f=$1 mode=$2 res=${3:-} lim=${4:-} out=$WORK/f$1.toml
    {
        printf '[server]\nunix = "%s/f%s.sock"\ninterval_s = 0\nqueue_depth = 64\n' "$WORK" "$f"
        printf '[backend]\nkind = "rbd"\nconf = "%s"\n' "$CONF"
        if [ "$mode" = global ]; then
            local peers=() p
            for p in 1 2 3; do [ "$p" = "$f" ] || peers+=("\"127.0.0.1:${PORTS[$p]}\""); done
            printf '[cluster]\nfront = %s\nlisten = "127.0.0.1:%s"\npeers = [%s]\n' "$f" "${PORTS[$f]}" "$(IFS=,; echo "${peers[*]}")"
            [ -n "${LATENCY_MS:-}" ] && printf 'latency_target_ms = %s\n' "$LATENCY_MS"
            for w in $WEIGHTS; do
                printf '[[cluster.tenant]]\nname = "%s"\nweight = %s\n' "${w%:*}" "${w#*:}"
                [ "${w%:*}" = t1 ] && printf 'reservation_iops = %s\n' "$res"
                [ "${w%:*}" = t6 ] && printf 'limit_iops = %s\n' "$lim"
            done
        fi
        for v in $VOLUMES; do
            [ "${v#*:}" = "$f" ] || continue
            printf '[[tenant]]\nname = "%s"\nimage = "v-%s-%s"\n' "${v%:*}" "${v%:*}" "$f"
        done
    } >"$out"
}

start_fronts() {
    local f
    for f in 1 2 3; do
        "$BIN" serve "$WORK/f$f.toml" 2>"$WORK/f$f.log" &
        PIDS+=($!)
    done
    for f in 1 2 3; do
        for _ in $(seq 200); do [ -S "$WORK/f$f.sock" ] && break; sleep 0.05; done
        [ -S "$WORK/f$f.sock" ] || { cat "$WORK/f$f.log"; exit 1; }
    done
}

# run MODE: one fio per volume; t3's load moves from front 2 to front 3 at SECS/2
run_clients() {
    local mode=$1 half=$((SECS / 2)) jobs=() v t f args
    mkdir -p "$WORK/$mode"
    for v in $VOLUMES; do
        t=${v%:*}
        f=${v#*:}
        args=(--runtime="$SECS")
        [ "$t:$f" = t3:2 ] && args=(--runtime="$half")
        [ "$t:$f" = t3:3 ] && args=(--startdelay="$half" --runtime="$((SECS - half))")
        fio --name="$t-$f" --ioengine=nbd --uri="nbd+unix:///$t?socket=$WORK/f$f.sock" \
            --rw=randread --bs=4k --iodepth="$DEPTH" --size=256m --time_based "${args[@]}" \
            --write_iops_log="$WORK/$mode/$t-$f" --log_avg_msec=1000 --output-format=terse \
            >"$WORK/$mode/$t-$f.out" 2>&1 &
        jobs+=($!)
    done
    for j in "${jobs[@]}"; do wait "$j"; done
}

analyse() {  # MODE RES_IOPS LIMIT_IOPS
    python3 - "$WORK/$1" "$1" "$SECS" "$WEIGHTS" "${2:-0}" "${3:-0}" <<'EOF'
import glob, os, sys
folder, mode, secs, weights, res, lim = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), float(sys.argv[6])
w = {x.split(':')[0]: float(x.split(':')[1]) for x in weights.split()}
per = {t: [0.0] * secs for t in w}
for path in glob.glob(os.path.join(folder, '*_iops.*.log')):
    t = os.path.basename(path).split('-')[0]
    # fio's log times count from the job's own start: the volume t3 moves to starts
    # half-way
    late = secs // 2 * 1000 if os.path.basename(path).startswith('t3-3_') else 0
    for line in open(path):
        ms, v = line.split(',')[:2]
        s = (int(ms) + late) // 1000
        if 0 <= s < secs:
            per[t][s] += float(v)
def ideal(total):
    # mClock's split: t1's reservation first where its weight gives it less, t6 capped
    # at its limit, the weights share the rest (water-filling)
    fixed = {}
    while True:
        free = [t for t in w if t not in fixed]
        left = total - sum(fixed.values())
        split = {t: left * w[t] / sum(w[x] for x in free) for t in free}
        more = {}
        if res > 0 and 't1' in split and split['t1'] < res:
            more['t1'] = res
        elif lim > 0 and 't6' in split and split['t6'] > lim:
            more['t6'] = lim
        if not more:
            return {**fixed, **split}
        fixed.update(more)
errs, resmet, overs, totals = [], [], [], []
for s in range(2, secs - 1):   # the first two seconds are the clients' start
    got = {t: per[t][s] for t in w}
    total = sum(got.values())
    if total <= 0:
        continue
    totals.append(total)
    want = ideal(total) if mode == 'global' else {t: total * w[t] / sum(w.values()) for t in w}
    errs.append(sum(abs(got[t] - want[t]) for t in w) / (2 * total) * 100)
    if os.environ.get('WINDOWS') == '1':
        print(f"  {mode} {s:3} s {total:7.0f} IOPS  error {errs[-1]:5.1f} %  " + ' '.join(f"{t} {got[t] / total * 100:4.1f}/{want[t] / total * 100:4.1f}" for t in w))
    if res > 0:
        resmet.append(got['t1'] >= 0.95 * res)
    if lim > 0:
        overs.append(max(0.0, got['t6'] / lim - 1) * 100)
half = secs // 2
after = [e for s, e in zip(range(2, secs - 1), errs) if s >= half]
# settled: from 2/5 of the run on, the shift's window and the next aside
settled = [e for s, e in zip(range(2, secs - 1), errs) if s >= secs * 2 // 5 and not half <= s < half + 2]
conv = next((i for i, e in enumerate(after) if e <= 5.0), None)
mean = lambda x: sum(x) / len(x) if x else float('nan')
print(f"{mode:8} total {mean(totals):8.0f} IOPS  share error mean {mean(errs):5.1f} %  max {max(errs):5.1f} %  settled {mean(settled):4.1f} %"
      + (f"  t1 reservation met {sum(resmet)}/{len(resmet)} s" if resmet else "")
      + (f"  t6 over limit max {max(overs):4.1f} %" if overs else "")
      + (f"  back under 5 % {conv} s after the shift" if conv is not None else "  not back under 5 % after the shift"))
tot = {t: sum(per[t][2:secs - 1]) for t in w}
print('         per tenant (share of all): ' + '  '.join(f"{t} {tot[t] / sum(tot.values()) * 100:4.1f} %" for t in w))
EOF
}

# 1. none
for f in 1 2 3; do front_config "$f" none; done
start_fronts
run_clients none
stop_fronts
CAP=$(python3 -c "
import glob
s=0
for p in glob.glob('$WORK/none/*_iops.*.log'):
    v=[float(l.split(',')[1]) for l in open(p)][2:-1]
    s+=sum(v)/len(v) if v else 0
print(round(s))")
RES_IOPS=$(python3 -c "print(round($CAP * $RES))")
LIM_IOPS=$(python3 -c "print(round($CAP * $LIMIT))")

# 2. librbd's per-image limits, each tenant's weight's share split over its volumes
for v in $VOLUMES; do
    t=${v%:*}
    n=$(echo "$VOLUMES" | tr ' ' '\n' | grep -c "^$t:")
    wt=$(echo "$WEIGHTS" | tr ' ' '\n' | grep "^$t:" | cut -d: -f2)
    per=$(python3 -c "print(max(1, round($CAP * $wt / 14 / $n)))")
    rbd image-meta set "rbd/v-$t-${v#*:}" conf_rbd_qos_iops_limit "$per"
done
for f in 1 2 3; do front_config "$f" none; done
start_fronts
run_clients rbdqos
stop_fronts
for v in $VOLUMES; do rbd image-meta remove "rbd/v-${v%:*}-${v#*:}" conf_rbd_qos_iops_limit; done

# 3. the fronts' exchange
for f in 1 2 3; do front_config "$f" global "$RES_IOPS" "$LIM_IOPS"; done
start_fronts
run_clients global
stop_fronts

echo "cluster: $NUM_OSDS OSD(s), pool size $NUM_OSDS; 3 fronts, 10 volumes, iodepth $DEPTH, ${SECS}s, t3 moves from front 2 to 3 at $((SECS / 2))s; $(nproc) CPUs, $(uname -r)"
echo "speed under none: $CAP IOPS; t1 reservation $RES_IOPS IOPS, t6 limit $LIM_IOPS IOPS (global only)"
analyse none
analyse rbdqos
analyse global "$RES_IOPS" "$LIM_IOPS"
