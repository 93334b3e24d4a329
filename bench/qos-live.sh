#!/usr/bin/env bash
# Live QoS accuracy with unchanged fio clients: the server runs 4 tenants (weights
# 100:50:25:10), one fio client per export (ioengine=nbd, 4 KiB, iodepth 32) doing
# random read, random write and 50/50 in turn, under each policy, on the `file` backend
# and on an emulated aged nvme-p4500; then the MCFQ setting (10:7:4:1, emulated aged
# sata-840pro, fileserver-like jobs). Prints per-tenant MB/s, total relative to `none`
# and the share error (mean over tenants of |share − ideal| / ideal, all backlogged).
# Last the SLO setting (emulated aged sata-840pro): t1 and t2 agreed
# {500 IOPS, 4 KiB, rt 5 ms} (and reserve 500 IOPS, for mClock); t1 keeps to it (reads
# at 500 IOPS, iodepth 4) while t2 breaks it (4 KiB random writes at iodepth 32), and t3,
# with no SLO, floods too (the same writes; SLO_BEST_EFFORT=0 leaves it out), under none,
# ta1, ta2, ta3, mclock; prints t1's IOPS, p99, p99.9 and errors, t2's completed, refused
# and held-back requests per second, and t3's completed per second. t1 arrives Poisson (SLO_ARRIVALS, or "linear"); the server holds back what
# a policy refuses (SLO_REFUSE="hold", the default) or answers it with EIO ("error": fio
# resubmits a refused request at once, so t2's refusals run high).
#
#   bench/qos-live.sh                        # everything, 10 s per cell
#   RUNTIME=5 POLICIES="none feedbac" SETTINGS=emulated bench/qos-live.sh
#
# Environment: RUNTIME (10), POLICIES ("none bfq sfq feedbac mots"; a policy's
# parameters as NAME:KEY=VALUE,KEY=VALUE, e.g. feedbac:period_ms=20), SETTINGS
# ("file emulated mcfq slo"), SLO_ARRIVALS (poisson), SLO_REFUSE (hold), WORKLOADS of the
# file and emulated settings ("randread
# randwrite randrw"), SLO_RT_US (5000: under `none` the flood pushes t1's p99 past
# it), SLO_POLICIES ("none ta1 ta2 ta3 mclock"), SLO_BEST_EFFORT (1), BENCH_DIR (target/qos-live: the `file` setting's image,
# use a real disk), EMULATED_DIR (/dev/shm/ioshare-qos when /dev/shm exists, else
# BENCH_DIR), THREADS (server.threads; unset: the server's default). An emulated
# request is answered when its data I/O is done *and* the model
# says so; its data must come faster than the modelled drive, or the host's disk is what
# gets measured (a cold page cache made the first `none` run 3× slower than a warm one
# here). So the emulated images live in memory; each is removed after its setting
# (up to 8 GiB while it runs).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-10}
POLICIES=${POLICIES:-"none bfq sfq feedbac mots"}
SETTINGS=${SETTINGS:-"file emulated mcfq slo"}
WORKLOADS=${WORKLOADS:-"randread randwrite randrw"}
SLO_RT_US=${SLO_RT_US:-5000}
SLO_POLICIES=${SLO_POLICIES:-"none ta1 ta2 ta3 mclock"}
SLO_BEST_EFFORT=${SLO_BEST_EFFORT:-1}
SLO_ARRIVALS=${SLO_ARRIVALS:-poisson}
SLO_REFUSE=${SLO_REFUSE:-hold}
THREADS=${THREADS:-}
DIR=$(realpath -m "${BENCH_DIR:-target/qos-live}")
if [ -d /dev/shm ]; then EMULATED_DIR=${EMULATED_DIR:-/dev/shm/ioshare-qos}; fi
EMULATED_DIR=$(realpath -m "${EMULATED_DIR:-$DIR}")

source bench/common.sh
install_tools fio:fio nbdinfo:libnbd-bin
cargo build --release --quiet
mkdir -p "$DIR" "$EMULATED_DIR"
SOCK=$DIR/qos.sock


# config SETTING POLICY: the server configuration on stdout.
config() {
    local setting=$1 policy=$2 weights
    echo "[server]"
    echo "unix = \"$SOCK\""
    echo "interval_s = 0"
    echo "queue_depth = 32"
    [ -n "$THREADS" ] && echo "threads = $THREADS"
    [ "$setting" = slo ] && echo "refuse = \"$SLO_REFUSE\""
    if [[ $policy == *:* ]]; then
        # name:key=value,key=value → an inline table with the policy's parameters
        local params=${policy#*:}
        echo "policy = { name = \"${policy%%:*}\", ${params//,/, } }"
    else
        echo "policy = \"$policy\""
    fi
    echo "[backend]"
    case $setting in
    file)
        echo "kind = \"file\""
        echo "cache = \"none\""
        echo "path = \"$DIR/file.img\""
        ;;
    emulated)
        echo "kind = \"emulated\""
        echo "path = \"$EMULATED_DIR/emulated.img\""
        echo 'device = { model = "ssd", preset = "nvme-p4500", precondition = "aged", capacity_gib = 16 }'
        ;;
    mcfq | slo)
        echo "kind = \"emulated\""
        echo "path = \"$EMULATED_DIR/$setting.img\""
        echo 'device = { model = "ssd", preset = "sata-840pro", precondition = "aged", capacity_gib = 16 }'
        ;;
    esac
    if [ "$setting" = slo ]; then
        echo '[[tenant]]'
        echo 'name = "t1"'
        echo 'offset = "0g"'
        echo 'size = "2g"'
        echo "slo = { iops = 500.0, size = 4096, rt_us = $SLO_RT_US }"
        echo 'reservation_iops = 500.0'
        echo '[[tenant]]'
        echo 'name = "t2"'
        echo 'offset = "2g"'
        echo 'size = "2g"'
        echo "slo = { iops = 500.0, size = 4096, rt_us = $SLO_RT_US }"
        echo 'reservation_iops = 500.0'
        if [ "$SLO_BEST_EFFORT" = 1 ]; then
            echo '[[tenant]]'
            echo 'name = "t3"'
            echo 'offset = "4g"'
            echo 'size = "2g"'
        fi
        return
    fi
    if [ "$setting" = mcfq ]; then weights=(10 7 4 1); else weights=(100 50 25 10); fi
    for i in 0 1 2 3; do
        echo "[[tenant]]"
        echo "name = \"t$((i + 1))\""
        echo "offset = \"$((i * 2))g\""
        echo "size = \"2g\""
        echo "weight = ${weights[$i]}"
    done
}

# fill_image PATH: writes every block of the `file` setting's image once (random data,
# direct I/O). A sparse image reads its holes at memory speed and allocates on first
# write, so without this each policy met a different disk: `none`, run first, read
# mostly holes (3× faster than any later policy) and wrote mostly new blocks (slower).
fill_image() {
    local path=$1 size=$((8 << 30))
    if [ -f "$path" ] && [ "$(stat -c %s "$path")" -ge $size ] &&
        [ $(($(stat -c %b "$path") * $(stat -c %B "$path"))) -ge $size ]; then
        return 0
    fi
    echo "writing $path (8 GiB) once" >&2
    fio --name=fill --filename="$path" --rw=write --bs=1m --size=$size --direct=1 \
        --ioengine=psync --minimal >/dev/null
}

start_server() {
    config "$1" "$2" >"$DIR/serve.toml"
    rm -f "$SOCK"
    ./target/release/ioshare serve "$DIR/serve.toml" 2>"$DIR/serve.log" &
    wait_for_export "nbd+unix:///t1?socket=$SOCK" "$DIR/serve.log"
}

# run_clients WORKLOAD: one fio per export at once; prints each tenant's MB/s.
run_clients() {
    local workload=$1 job
    case $workload in
    randread) job=(--rw=randread --bs=4k) ;;
    randwrite) job=(--rw=randwrite --bs=4k) ;;
    randrw) job=(--rw=randrw --rwmixread=50 --bs=4k) ;;
    fileserver) job=(--rw=randrw --rwmixwrite=67 --bssplit=4k/20:16k/20:64k/30:128k/30) ;;
    esac
    local pids=()
    for i in 1 2 3 4; do
        fio --name="t$i" --ioengine=nbd "--uri=nbd+unix:///t$i?socket=$SOCK" "${job[@]}" \
            --iodepth=32 --size=2g --time_based --runtime="$RUNTIME" --ramp_time=2 \
            --randrepeat=0 --minimal >"$DIR/fio-$i.out" &
        pids+=($!)
    done
    wait "${pids[@]}"
    for i in 1 2 3 4; do
        # terse v3: read and write KiB/s in fields 7 and 48
        awk -F';' '$1 == 3 && NF > 50 { printf "%.1f ", ($7 + $48) * 1024 / 1e6 }' "$DIR/fio-$i.out"
    done
    echo
}

# slo_cell POLICY: t1 at its SLO rate, t2 flooding; prints a table row.
slo_cell() {
    # iodepth 4: the reader keeps its rate with room for a slow completion or two
    # (refusals, EIO, are counted as fio errors)
    fio --name=t1 --ioengine=nbd "--uri=nbd+unix:///t1?socket=$SOCK" --rw=randread --bs=4k \
        --iodepth=4 --rate_iops=500 --rate_process="$SLO_ARRIVALS" --continue_on_error=io --size=2g --time_based --runtime="$RUNTIME" --ramp_time=2 \
        --randrepeat=0 --minimal >"$DIR/fio-1.out" &
    local reader=$!
    # t2 goes on after a refusal too (without continue_on_error fio stops at the first
    # EIO, and the reader then runs alone)
    fio --name=t2 --ioengine=nbd "--uri=nbd+unix:///t2?socket=$SOCK" --rw=randwrite --bs=4k \
        --iodepth=32 --continue_on_error=io --size=2g --time_based --runtime="$RUNTIME" \
        --ramp_time=2 --randrepeat=0 --minimal >"$DIR/fio-2.out" &
    local pids=($reader $!)
    if [ "$SLO_BEST_EFFORT" = 1 ]; then
        fio --name=t3 --ioengine=nbd "--uri=nbd+unix:///t3?socket=$SOCK" --rw=randwrite \
            --bs=4k --iodepth=32 --continue_on_error=io --size=2g --time_based \
            --runtime="$RUNTIME" --ramp_time=2 --randrepeat=0 --minimal >"$DIR/fio-3.out" &
        pids+=($!)
    fi
    wait "${pids[@]}"
    # terse v3: read IOPS in field 8, read completion-latency percentiles (µs) in 18-37
    local t1 t2
    t1=$(awk -F';' '$1 == 3 && NF > 50 {
        for (f = 18; f <= 37; f++) {
            split($f, kv, "=")
            if (kv[1] == "99.000000%") p99 = kv[2]
            if (kv[1] == "99.900000%") p999 = kv[2]
        }
        # with continue_on_error, the error count and the first error close the line
        printf "%d | %.2f ms | %.2f ms | %d", $8, p99 / 1000, p999 / 1000, $(NF - 1)
    }' "$DIR/fio-1.out")
    echo "| $1 | $t1 |"
}

echo "# $(date -u +%F) $(nproc) CPUs, $(uname -r), $(fio --version); ${RUNTIME} s per cell after 2 s ramp"
for setting in $SETTINGS; do
    [ "$setting" = file ] && fill_image "$DIR/file.img"
    if [ "$setting" = slo ]; then
        rows=()
        for policy in $SLO_POLICIES; do
            start_server slo "$policy"
            row=$(slo_cell "$policy")
            stop_server
            # t2 from the server's closing summary ("t2: N requests, ..., R refused"),
            # over fio's whole life (ramp included): fio counts a refused request as an
            # I/O done, so its own IOPS are mostly refusals
            row+=$(awk -v secs=$((RUNTIME + 2)) '$2 == "t2:" {
                for (i = 4; i < NF; i++) {
                    if ($(i + 1) ~ /^refused/) refused = $i
                    if ($(i + 1) == "held") held = $i
                }
                t2 = sprintf(" %d | %d | %d |", $3 / secs, refused / secs, held / secs) }
                $2 == "t3:" { t3 = sprintf(" %d |", $3 / secs) }
                END { printf "%s%s", t2, (t3 == "" ? " - |" : t3) }' "$DIR/serve.log")
            rows+=("$row")
            echo "slo $policy: $row" >&2
        done
        echo
        echo "### slo (t1 and t2: SLO 500 IOPS of 4 KiB within $((SLO_RT_US / 1000)) ms; t1 reads at 500 IOPS ($SLO_ARRIVALS), t2 floods; t3 (no SLO) floods: $SLO_BEST_EFFORT; server refuse = \"$SLO_REFUSE\")"
        echo
        echo "| policy | t1 IOPS | t1 p99 | t1 p99.9 | t1 errors | t2 writes/s done | t2 refused/s | t2 held back/s | t3 writes/s done |"
        echo "|---|---|---|---|---|---|---|---|---|"
        printf '%s\n' "${rows[@]}"
        remove_image "$EMULATED_DIR/slo.img"
        continue
    fi
    if [ "$setting" = mcfq ]; then
        workloads=(fileserver)
        weights="10 7 4 1"
        policies="none cfq mots"
    else
        read -ra workloads <<<"$WORKLOADS"
        weights="100 50 25 10"
        policies=$POLICIES
    fi
    declare -A bw=()
    for policy in $policies; do
        start_server "$setting" "$policy"
        for w in "${workloads[@]}"; do
            bw[$policy,$w]=$(run_clients "$w")
            echo "$setting $policy $w: ${bw[$policy,$w]}" >&2
        done
        stop_server
    done
    echo
    echo "### $setting (weights $weights)"
    echo
    echo "| workload | policy | MB/s t1 t2 t3 t4 | total MB/s | total / none | share error |"
    echo "|---|---|---|---|---|---|"
    for w in "${workloads[@]}"; do
        for policy in $policies; do
            awk -v w="$w" -v p="$policy" -v bws="${bw[$policy,$w]}" -v base="${bw[none,$w]}" \
                -v ws="$weights" 'BEGIN {
                n = split(bws, b, " "); split(base, z, " "); split(ws, wt, " ")
                total = 0; ztotal = 0; wsum = 0
                for (i = 1; i <= n; i++) { total += b[i]; ztotal += z[i]; wsum += wt[i] }
                err = 0
                for (i = 1; i <= n; i++) {
                    ideal = wt[i] / wsum
                    share = total > 0 ? b[i] / total : 0
                    d = share - ideal; if (d < 0) d = -d
                    err += d / ideal
                }
                printf "| %s | %s | %s | %.1f | %.2f | %.1f %% |\n", w, p, bws, total,
                    (ztotal > 0 ? total / ztotal : 0), 100 * err / n
            }'
        done
    done
    unset bw
    [ "$setting" != file ] && remove_image "$EMULATED_DIR/$setting.img"
done
