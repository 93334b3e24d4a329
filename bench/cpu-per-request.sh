#!/usr/bin/env bash
# The server's CPU per request, beside nbdkit and qemu-nbd in the same run: fio
# (ioengine=nbd, unix socket) against each server's null backend and against a file, for
# every workload, queue depth and connection count asked; the server's CPU is utime +
# stime from /proc/PID/stat (every thread of the process) over the fio run, divided by the
# requests fio completed. `perf stat` cycles too where the machine counts them.
#
#   bench/cpu-per-request.sh                                  # the whole matrix, 5 s a cell
#   DEPTHS=32 CONNS=1 WORKLOADS="randread:4k randwrite:4k" ROUNDS=2 bench/cpu-per-request.sh
#
# Environment: BACKENDS ("null file"), TARGETS ("ioshare:none nbdkit qemu-nbd";
# ioshare:POLICY for another policy, e.g. ioshare:sfq), WORKLOADS ("randread:4k
# randwrite:4k randread:128k randwrite:128k", fio rw:bs), DEPTHS ("1 32 128"), CONNS ("1
# 4": fio jobs, one connection each), RUNTIME (seconds a cell, 5), ROUNDS (1: the servers
# in turn, ROUNDS times, so that a drift of the machine shows), SIZE (1g), MODE (the file
# backend's cache mode, writeback), THREADS (ioshare's server.threads; unset: its
# default), IOSHARE (the binary, default this tree's release build), BASE (another
# ioshare binary, e.g. the build before a change: targets base:POLICY run it, and a
# column gives ioshare / base, an A/B in one run), BENCH_DIR
# (target/bench), OUT (also append the table to this file).
set -euo pipefail
cd "$(dirname "$0")/.."

BACKENDS=${BACKENDS:-"null file"}
TARGETS=${TARGETS:-"ioshare:none nbdkit qemu-nbd"}
WORKLOADS=${WORKLOADS:-"randread:4k randwrite:4k randread:128k randwrite:128k"}
DEPTHS=${DEPTHS:-"1 32 128"}
CONNS=${CONNS:-"1 4"}
RUNTIME=${RUNTIME:-5}
ROUNDS=${ROUNDS:-1}
SIZE=${SIZE:-1g}
MODE=${MODE:-writeback}
THREADS=${THREADS:-}
IOSHARE=${IOSHARE:-}
DIR=$(realpath -m "${BENCH_DIR:-target/bench}")

source bench/common.sh
install_tools fio:fio qemu-nbd:qemu-utils nbdinfo:libnbd-bin nbdkit:nbdkit
IOSHARE=$(ioshare_binary "$IOSHARE")
mkdir -p "$DIR"
FILE=$DIR/cpu.img
SOCK=$DIR/cpu.sock
bytes=$(numfmt --from=iec "${SIZE^^}")
[[ " $BACKENDS " == *" file "* ]] && fill_file "$FILE" "$SIZE" >/dev/null
TICKS=$(getconf CLK_TCK)
PERF=0
if command -v perf >/dev/null 2>&1 &&
    perf stat -x, -e cycles true 2>&1 >/dev/null | grep -q '^[0-9]'; then
    PERF=1
fi

# start_server TARGET BACKEND: serves export "disk" on $SOCK.
start_server() {
    local target=$1 backend=$2
    rm -f "$SOCK"
    case $target in
    ioshare:* | base:*)
        local bin=$IOSHARE
        [[ $target == base:* ]] && bin=${BASE:?"BASE names the binary base:POLICY runs"}
        local storage
        if [ "$backend" = null ]; then
            storage=$'[backend]\nkind = "null"'
        else
            storage=$(printf '[backend]\ncache = "%s"' "$MODE")
        fi
        local file_line=""
        [ "$backend" = file ] && file_line="file = \"$FILE\""
        local threads_line=""
        [ -n "$THREADS" ] && threads_line="threads = $THREADS"
        cat >"$DIR/cpu-ioshare.toml" <<EOF
[server]
unix = "$SOCK"
interval_s = 0
queue_depth = 256
policy = "${target#*:}"
$threads_line
$storage
[[tenant]]
name = "disk"
$file_line
size = $bytes
EOF
        "$bin" serve "$DIR/cpu-ioshare.toml" 2>"$DIR/cpu-server.log" &
        ;;
    nbdkit)
        if [ "$backend" = null ]; then
            nbdkit --foreground --unix "$SOCK" --exportname disk null size="$bytes" \
                2>"$DIR/cpu-server.log" &
        else
            nbdkit --foreground --unix "$SOCK" --exportname disk file "$FILE" \
                2>"$DIR/cpu-server.log" &
        fi
        ;;
    qemu-nbd)
        local image=("$FILE" --format=raw --cache="$MODE" --aio=io_uring)
        [ "$backend" = null ] &&
            image=(--image-opts "driver=null-co,size=$bytes,read-zeroes=on")
        qemu-nbd --socket="$SOCK" --export-name=disk --shared=16 --persistent \
            "${image[@]}" 2>"$DIR/cpu-server.log" &
        ;;
    *)
        echo "unknown target $target" >&2
        exit 1
        ;;
    esac
    wait_for_export "nbd+unix:///disk?socket=$SOCK" "$DIR/cpu-server.log"
}

# cpu_ticks PID: utime + stime of the whole process, clock ticks.
cpu_ticks() {
    # The command name (field 2) may hold spaces: count from after its ")".
    sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}

# measure RW BS DEPTH CONNS: prints "requests cpu_seconds cycles" for one fio run.
measure() {
    local rw=$1 bs=$2 depth=$3 conns=$4 perf_pid="" cycles=-
    local before after out
    if [ $PERF = 1 ]; then
        perf stat -x, -e cycles -p "$server_pid" -o "$DIR/cpu-perf.txt" &
        perf_pid=$!
    fi
    before=$(cpu_ticks "$server_pid")
    out=$(fio --name=c --ioengine=nbd "--uri=nbd+unix:///disk?socket=$SOCK" --rw="$rw" \
        --bs="$bs" --iodepth="$depth" --numjobs="$conns" --size="$SIZE" --time_based \
        --runtime="$RUNTIME" --randrepeat=0 --norandommap --group_reporting \
        --output-format=json)
    after=$(cpu_ticks "$server_pid")
    if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid"
        wait "$perf_pid" || true
        cycles=$(awk -F, '$3 == "cycles" { print $1 }' "$DIR/cpu-perf.txt")
    fi
    # fio's nbd engine prints a line before the JSON.
    requests=$(sed -n '/^{/,$p' <<<"$out" | python3 -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
print(sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in jobs))')
    echo "$requests $(((after - before))) ${cycles:--}"
}

read -r -a targets <<<"$TARGETS"
cells=()
for w in $WORKLOADS; do
    for d in $DEPTHS; do
        for c in $CONNS; do cells+=("${w%%:*} ${w#*:} $d $c"); done
    done
done
declare -A us=() iops=() cyc=()
for round in $(seq "$ROUNDS"); do
    for backend in $BACKENDS; do
        for target in "${targets[@]}"; do
            start_server "$target" "$backend"
            for cell in "${cells[@]}"; do
                read -r requests ticks cycles <<<"$(measure $cell)"
                key="$round,$backend,$target,$cell"
                us[$key]=$(awk -v t="$ticks" -v hz="$TICKS" -v n="$requests" \
                    'BEGIN { printf "%.2f", n ? t / hz * 1e6 / n : 0 }')
                iops[$key]=$(awk -v n="$requests" -v s="$RUNTIME" 'BEGIN { printf "%.0f", n / s / 1000 }')
                cyc[$key]=$(awk -v c="$cycles" -v n="$requests" \
                    'BEGIN { if (c == "-" || !n) print "-"; else printf "%.0f", c / n }')
                echo "round $round $backend $target $cell: ${us[$key]} µs/request, ${iops[$key]} k IOPS, ${cyc[$key]} cycles/request" >&2
            done
            stop_server
        done
    done
done

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "–"; else printf "%.2f", a / b }'
}

table() {
    echo "# $(date -u +%F) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(uname -r), $(fio --version), nbdkit $(nbdkit --version | cut -d' ' -f2), qemu-nbd $(qemu-nbd --version | head -1 | cut -d' ' -f2)"
    echo "# server CPU µs per request (thousands of requests a second in brackets), ${RUNTIME} s a cell, file backend cache $MODE${THREADS:+, ioshare threads $THREADS}"
    local header="| backend | workload | depth | conns |" rule="|---|---|---|---|"
    for round in $(seq "$ROUNDS"); do
        for t in "${targets[@]}"; do
            if [ "$ROUNDS" -gt 1 ]; then header+=" $t (round $round) |"; else header+=" $t |"; fi
            rule+="---|"
        done
        header+=" ioshare / best other |"
        rule+="---|"
        if [[ " ${targets[*]}" == *" base:"* ]]; then
            header+=" ioshare / base |"
            rule+="---|"
        fi
    done
    echo
    echo "$header"
    echo "$rule"
    for backend in $BACKENDS; do
        for cell in "${cells[@]}"; do
            read -r rw bs d c <<<"$cell"
            local row="| $backend | $rw $bs | $d | $c |"
            for round in $(seq "$ROUNDS"); do
                local mine="" best="" base=""
                for t in "${targets[@]}"; do
                    local k="$round,$backend,$t,$cell" extra=""
                    [ "${cyc[$k]}" != "-" ] && extra=", ${cyc[$k]} cycles"
                    row+=" ${us[$k]} (${iops[$k]} k$extra) |"
                    if [[ $t == ioshare:* ]]; then
                        [ -z "$mine" ] && mine=${us[$k]}
                    elif [[ $t == base:* ]]; then
                        [ -z "$base" ] && base=${us[$k]}
                    elif [ -z "$best" ] || awk -v a="${us[$k]}" -v b="$best" 'BEGIN { exit !(a < b) }'; then
                        best=${us[$k]}
                    fi
                done
                row+=" $(ratio "$mine" "$best") |"
                [[ " ${targets[*]}" == *" base:"* ]] && row+=" $(ratio "$mine" "$base") |"
            done
            echo "$row"
        done
    done
}
table | tee -a "${OUT:-/dev/null}"
