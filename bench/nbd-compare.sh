#!/usr/bin/env bash
# Side by side, in one run: fio (ioengine=nbd) against ioshare (policy none), nbdkit's
# file plugin and qemu-nbd, all serving the same file in the same cache mode over a unix
# socket, and fio (io_uring) on the file itself. Prints a markdown table per cache mode
# with IOPS, MB/s and ratios.
#
#   bench/nbd-compare.sh                 # both cache modes, 10 s per cell
#   MODES=none RUNTIME=30 bench/nbd-compare.sh
#
# Environment: MODES ("none writeback"), RUNTIME (seconds per cell, 10), SIZE (file size,
# 1g), IODEPTH (32), BENCH_DIR (where the file lives, target/bench: use a real disk;
# cache mode none needs O_DIRECT, which tmpfs lacks), TARGETS ("raw ioshare nbdkit
# qemu-nbd"; cells of the others print as –), WORKLOADS ("randread:4k randwrite:4k
# read:128k write:128k", fio rw:bs), IOSHARE (the ioshare binary to measure, e.g. an older
# build to compare with; default: this tree's release build).
set -euo pipefail
cd "$(dirname "$0")/.."

MODES=${MODES:-"none writeback"}
RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1g}
IODEPTH=${IODEPTH:-32}
TARGETS=${TARGETS:-"raw ioshare nbdkit qemu-nbd"}
WORKLOADS=${WORKLOADS:-"randread:4k randwrite:4k read:128k write:128k"}
IOSHARE=${IOSHARE:-}
DIR=$(realpath -m "${BENCH_DIR:-target/bench}")

source bench/common.sh
install_tools fio:fio qemu-nbd:qemu-utils nbdinfo:libnbd-bin nbdkit:nbdkit
IOSHARE=$(ioshare_binary "$IOSHARE")

mkdir -p "$DIR"
FILE=$DIR/disk.img
SOCK=$DIR/nbd.sock
bytes=$(fill_file "$FILE" "$SIZE" 1)


# start_server TARGET MODE: serves $FILE as export "disk" on $SOCK.
start_server() {
    local target=$1 mode=$2
    rm -f "$SOCK"
    case $target in
    ioshare)
        cat >"$DIR/ioshare.toml" <<EOF
[server]
unix = "$SOCK"
interval_s = 0
queue_depth = $IODEPTH
policy = "none"
[backend]
cache = "$mode"
[[tenant]]
name = "disk"
file = "$FILE"
size = $bytes
EOF
        "$IOSHARE" serve "$DIR/ioshare.toml" 2>"$DIR/ioshare.log" &
        ;;
    nbdkit)
        # nbdkit 1.32's file plugin has no O_DIRECT; its cache=none evicts written and
        # read pages from the page cache, the nearest it comes.
        local cache=default
        [ "$mode" = none ] && cache=none
        nbdkit --foreground --unix "$SOCK" --exportname disk file "$FILE" cache=$cache \
            2>"$DIR/nbdkit.log" &
        ;;
    qemu-nbd)
        qemu-nbd --socket="$SOCK" --export-name=disk --format=raw --cache="$mode" \
            --aio=io_uring --shared=16 --persistent "$FILE" 2>"$DIR/qemu-nbd.log" &
        ;;
    esac
    wait_for_export "nbd+unix:///disk?socket=$SOCK" "$DIR/$target.log"
}

# measure TARGET MODE RW BS: prints "IOPS MB/s".
measure() {
    local target=$1 mode=$2 rw=$3 bs=$4 engine
    if [ "$target" = raw ]; then
        local direct=0
        [ "$mode" = none ] && direct=1
        engine=(--ioengine=io_uring --filename="$FILE" --direct=$direct)
    else
        engine=(--ioengine=nbd "--uri=nbd+unix:///disk?socket=$SOCK")
    fi
    fio --name=b "${engine[@]}" --rw="$rw" --bs="$bs" --iodepth="$IODEPTH" --size="$SIZE" \
        --time_based --runtime="$RUNTIME" --ramp_time=2 --randrepeat=0 --minimal |
        awk -F';' -v rw="$rw" '$1 == 3 && NF > 50 {
            # terse v3 (fio nbd also prints a "connected" line): read KiB/s and IOPS in
            # fields 7 and 8, write in 48 and 49
            if (rw ~ /write/) { bw = $48; iops = $49 } else { bw = $7; iops = $8 }
            printf "%d %.1f\n", iops, bw * 1024 / 1e6
        }'
}

read -r -a targets <<<"$TARGETS"
workloads=()
for w in $WORKLOADS; do workloads+=("${w%%:*} ${w#*:}"); done
echo "# $(date -u +%F) $(nproc) CPUs, $(uname -r), $(fio --version), nbdkit $(nbdkit --version | cut -d' ' -f2), $(qemu-nbd --version | head -1 | cut -d' ' -f2)"
echo "# file $FILE ($SIZE on $(findmnt -no FSTYPE -T "$DIR")), iodepth $IODEPTH, ${RUNTIME} s per cell after 2 s ramp"
for mode in $MODES; do
    declare -A result=()
    for target in "${targets[@]}"; do
        [ "$target" != raw ] && start_server "$target" "$mode"
        for w in "${workloads[@]}"; do
            result[$target,$w]=$(measure "$target" "$mode" $w)
            echo "cache=$mode $target $w: ${result[$target,$w]}" >&2
        done
        stop_server
        rm -f "$SOCK"
    done
    echo
    echo "### cache mode \`$mode\`"
    echo
    echo "| workload | raw fio (io_uring) | ioshare | nbdkit file | qemu-nbd | ioshare / raw | ioshare / best of nbdkit, qemu-nbd |"
    echo "|---|---|---|---|---|---|---|"
    for w in "${workloads[@]}"; do
        read -r raw_iops raw_mb <<<"${result[raw,$w]:-}"
        read -r io_iops io_mb <<<"${result[ioshare,$w]:-}"
        read -r kit_iops kit_mb <<<"${result[nbdkit,$w]:-}"
        read -r qemu_iops qemu_mb <<<"${result[qemu-nbd,$w]:-}"
        awk -v w="$w" -v r="$raw_iops" -v rm="$raw_mb" -v i="$io_iops" -v im="$io_mb" \
            -v k="$kit_iops" -v km="$kit_mb" -v q="$qemu_iops" -v qm="$qemu_mb" '
        function cell(iops, mb, unit) { return iops == "" ? "–" : sprintf("%d%s, %.0f%s", iops, unit ? " IOPS" : "", mb, unit ? " MB/s" : "") }
        function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "–" : sprintf("%.2f", a / b) }
        BEGIN {
            best = (k == "" || (q != "" && q > k)) ? q : k
            printf "| %s | %s | %s | %s | %s | %s | %s |\n", w, cell(r, rm, 1), cell(i, im),
                cell(k, km), cell(q, qm), ratio(i, r), ratio(i, best)
        }'
    done
    unset result
done
