#!/usr/bin/env bash
# PDC (Kim & Lee): a host cache that guest file-system journals do not pollute. Real
# ext4 "guests" on ioshare exports, compared under backend.cache = writeback, none and
# pdc. Three parts (PARTS, default all):
#
#   accuracy  The journal detector against the truth: for a default, a 16 MiB and a
#             256 MiB journal, one guest runs dbench for ACC_SECONDS while
#             `serve --capture` records its requests; `ioshare journal-check` scores the
#             capture against `debugfs -R "stat <8>"`: precision and recall per byte and
#             per 128 MiB group, and the first pass the detector misses.
#   main      The pressure setting: the server in a memory cgroup of LIMIT MiB (v1
#             memory.limit_in_bytes) whose disk reads are throttled to READ_IOPS per
#             second (v1 blkio.throttle.read_iops_device; 200, a disk's random reads: a
#             miss is expensive, as on the paper's hosts, not 64 µs as here), MAILS
#             mail guests (fio: MAIL_FILES files of 16 KiB, 4 KiB random read/write,
#             fsync after every write, MAIL_RATE reads and MAIL_RATE writes per second:
#             rate-limited, so the CPU is not what limits) beside one read guest (fio
#             4 KiB O_DIRECT random reads at depth 4 of a hot file HOT_PCT % of the
#             limit). Per mode: set up, warm up (mail until the journals have wrapped
#             and, under pdc, been found; the hot file read twice), then RUNS windows of
#             SECONDS each. Per window: read IOPS and p99, mail ops/s per guest, fsync
#             p50/p99, disk reads, the read guest's hit ratio in the host cache
#             (1 − disk reads / its reads), host-cache MiB per image (fincore), CPU busy.
#   sweep     The same bed over SWEEP_LIMITS × SWEEP_MAILS, SWEEP_RUNS windows each, for
#             where PDC starts to matter.
#
#   bench/pdc.sh                                   # everything (about 35 minutes)
#   PARTS=main RUNS=2 WINDOW_S=20 bench/pdc.sh     # a quick look
#
# Needs root (cgroups, loop devices, mount), cgroup v1 memory and blkio controllers,
# /dev/fuse. Installs fio, dbench, nbdfuse (libnbd-bin), e2fsprogs, jq when missing.
# Writes everything under OUT (target/pdc-bench/results); the tables go to stdout and
# OUT/tables.md. Images live in BENCH_DIR (target/pdc-bench), on the disk being measured.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh

PARTS=${PARTS:-"accuracy main sweep"}
LIMIT=${LIMIT:-256}
MAILS=${MAILS:-4}
MODES=${MODES:-"writeback none pdc"}
RUNS=${RUNS:-5}
WINDOW_S=${WINDOW_S:-30}
READ_IOPS=${READ_IOPS:-200}
MAIL_RATE=${MAIL_RATE:-100}
MAIL_FILES=${MAIL_FILES:-2000}
HOT_PCT=${HOT_PCT:-85}
WARM=${WARM:-60}
ACC_SECONDS=${ACC_SECONDS:-40}
SWEEP_LIMITS=${SWEEP_LIMITS:-"256 1024"}
SWEEP_MAILS=${SWEEP_MAILS:-"2 6"}
SWEEP_MODES=${SWEEP_MODES:-"writeback pdc"}
SWEEP_RUNS=${SWEEP_RUNS:-2}
B=$(realpath -m "${BENCH_DIR:-target/pdc-bench}")
OUT=$(realpath -m "${OUT:-$B/results}")
BIN=$(realpath "${IOSHARE_BIN:-target/release/ioshare}")
CG_MEM=/sys/fs/cgroup/memory/ioshare-pdc
CG_BLK=/sys/fs/cgroup/blkio/ioshare-pdc

[ "$(id -u)" = 0 ] || { echo "pdc.sh: needs root (cgroups, losetup, mount)" >&2; exit 1; }
for c in memory blkio; do
    [ -d /sys/fs/cgroup/$c ] || { echo "pdc.sh: no cgroup v1 $c controller at /sys/fs/cgroup/$c" >&2; exit 1; }
done
[ -e /dev/fuse ] || { echo "pdc.sh: no /dev/fuse" >&2; exit 1; }
install_tools curl:curl fio:fio dbench:dbench nbdfuse:libnbd-bin mkfs.ext4:e2fsprogs jq:jq fincore:util-linux
cargo build --release --quiet
mkdir -p "$B" "$OUT"
R=$B/run
log() { echo "[$(date +%T)] $*" >&2; }

# The device under the images, for the read throttle and /proc/diskstats.
mkdir -p "$R"
DEVNUM=$(stat -c '%Hd:%Ld' "$R" 2>/dev/null || true)
if [ -z "$DEVNUM" ] || [ "$DEVNUM" = "0:0" ]; then
    DEVNUM=$(lsblk -no MAJ:MIN "$(df --output=source "$R" | tail -1)" | head -1 | tr -d ' ')
fi
DEVNAME=$(awk -v mm="$DEVNUM" '{ if ($1 ":" $2 == mm) print $3 }' /proc/diskstats)
# On a partition: the whole disk (the throttle takes only those).
PARENT=$(lsblk -no PKNAME "/dev/$DEVNAME" 2>/dev/null | head -1 | tr -d ' ')
if [ -n "$PARENT" ]; then
    DEVNAME=$PARENT
    DEVNUM=$(lsblk -dno MAJ:MIN "/dev/$PARENT" | tr -d ' ')
fi
log "images on device $DEVNUM ($DEVNAME)"

# --- the bed ------------------------------------------------------------------------
GUESTS=()
down() {
    local n
    pkill -f "fio --name=(mail|read|lay)" 2>/dev/null || true
    for _ in $(seq 50); do pgrep -f "fio --name=(mail|read|lay)" >/dev/null || break; sleep 0.1; done
    for n in "${GUESTS[@]}"; do
        if mountpoint -q "$R/mnt/$n"; then
            umount "$R/mnt/$n" 2>/dev/null || { sleep 1; umount "$R/mnt/$n" || umount -l "$R/mnt/$n" || true; }
        fi
        if [ -f "$R/$n.loop" ]; then
            losetup -d "$(cat "$R/$n.loop")" || true
            rm -f "$R/$n.loop"
        fi
    done
    sleep 0.3
    for n in "${GUESTS[@]}"; do
        if [ -f "$R/$n.fuse.pid" ]; then
            umount "$R/fuse/$n" 2>/dev/null || true
            kill "$(cat "$R/$n.fuse.pid")" 2>/dev/null || true
            rm -f "$R/$n.fuse.pid"
        fi
    done
    stop_server
    GUESTS=()
    remove_image "$R"/*.img
    rmdir "$CG_MEM" "$CG_BLK" 2>/dev/null || true
}
trap 'down; stop_server' EXIT

# start_server MODE LIMIT_MIB GUEST:SIZE... [-- serve args]: in the cgroups from its
# first instruction.
start_server() {
    local mode=$1 limit=$2
    shift 2
    local extra=()
    {
        echo "[server]"
        echo "unix = \"s.sock\""
        echo "interval_s = 0"
        echo "metrics = \"127.0.0.1:${METRICS_PORT:-9477}\""
        echo "[backend]"
        echo "cache = \"$mode\""
        while [ $# -gt 0 ]; do
            if [ "$1" = -- ]; then shift; extra=("$@"); break; fi
            echo "[[tenant]]"
            echo "name = \"${1%%:*}\""
            echo "file = \"${1%%:*}.img\""
            echo "create = true"
            echo "size = \"${1#*:}\""
            shift
        done
    } > "$R/serve.toml"
    mkdir -p "$CG_MEM" "$CG_BLK"
    echo $((limit << 20)) > "$CG_MEM/memory.limit_in_bytes"
    echo "$DEVNUM ${THROTTLE:-$READ_IOPS}" > "$CG_BLK/blkio.throttle.read_iops_device"
    rm -f "$R/s.sock"
    sh -c "echo \$\$ > $CG_MEM/cgroup.procs; echo \$\$ > $CG_BLK/cgroup.procs; exec $BIN serve $R/serve.toml ${extra[*]:-}" \
        > "$R/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 200); do [ -S "$R/s.sock" ] && return 0; sleep 0.05; done
    cat "$R/server.log" >&2
    echo "pdc.sh: the server did not start" >&2
    exit 1
}

# guest NAME [MKFS_ARGS...]: the export as a file (nbdfuse), a loop device on it with
# O_DIRECT (no second copy of the data in the guest's side of the page cache), ext4.
guest() {
    local n=$1
    shift
    mkdir -p "$R/fuse/$n" "$R/mnt/$n"
    rm -f "$R/$n.fuse.pid"
    nbdfuse -P "$R/$n.fuse.pid" "$R/fuse/$n" "nbd+unix:///$n?socket=$R/s.sock" > "$R/$n.fuse.log" 2>&1 &
    for _ in $(seq 200); do [ -s "$R/$n.fuse.pid" ] && break; sleep 0.05; done
    GUESTS+=("$n")
    local dev
    dev=$(losetup --direct-io=on -f --show "$R/fuse/$n/nbd")
    echo "$dev" > "$R/$n.loop"
    # Without direct I/O the loop device would cache the guest's reads outside the
    # server's memory group, in every mode alike.
    if [ "$(cat "/sys/block/${dev#/dev/}/loop/dio" 2>/dev/null)" != 1 ]; then
        echo "pdc.sh: $dev did not take --direct-io=on" >&2
        exit 1
    fi
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$@" "$dev"
    debugfs -R "stat <8>" "$dev" 2>/dev/null | sed -n '/EXTENTS/,$p' > "$R/$n.journal.txt"
    mount "$dev" "$R/mnt/$n"
}

cpu() { awk '/^cpu /{ print $2+$3+$4+$7+$8+$9, $5+$6 }' /proc/stat; }
disk_reads() { awk -v d="$DEVNAME" '$3 == d { print $6 }' /proc/diskstats; }
mib_resident() { fincore -b -n -o RES "$1" 2>/dev/null | awk '{ printf "%.1f", $1 / 1048576 }'; }
metric() { # NAME TENANT: a value from /metrics
    curl -s "http://127.0.0.1:${METRICS_PORT:-9477}/metrics" 2>/dev/null |
        awk -v k="$1{tenant=\"$2\"}" '$1 == k { print $2 }'
}

# Both run in the background: exec makes the job's pid fio's own.
mail_job() { # NAME SECONDS JSON
    exec fio --name=mail --directory="$R/mnt/$1/mail" --nrfiles="$MAIL_FILES" --filesize=16k \
        --bs=4k --rw=randrw --rwmixread=50 --fsync=1 --ioengine=psync \
        --rate_iops="$MAIL_RATE,$MAIL_RATE" --file_service_type=random --openfiles=64 \
        --time_based --runtime="$2" --output-format=json > "$3" 2>/dev/null
}
read_job() { # SECONDS JSON
    exec fio --name=read --filename="$R/mnt/read/hot.dat" --rw=randread --bs=4k --direct=1 \
        --ioengine=libaio --iodepth=4 --norandommap --randrepeat=0 \
        --time_based --runtime="$1" --output-format=json > "$2" 2>/dev/null
}

# bed MODE LIMIT MAILS: up and warm.
bed() {
    local mode=$1 limit=$2 mails=$3 specs=() i
    for i in $(seq "$mails"); do specs+=("mail$i:2g"); done
    start_server "$mode" "$limit" "${specs[@]}" read:1g
    for i in $(seq "$mails"); do guest "mail$i"; done
    guest read
    local hot=$((limit * HOT_PCT / 100))
    dd if=/dev/urandom of="$R/mnt/read/hot.dat" bs=1M count="$hot" oflag=direct status=none
    for i in $(seq "$mails"); do
        mkdir -p "$R/mnt/mail$i/mail"
        fio --name=lay --directory="$R/mnt/mail$i/mail" --nrfiles="$MAIL_FILES" --filesize=16k \
            --bs=16k --rw=write --create_only=1 > /dev/null 2>&1
    done
    sync
    # Warm: WARM seconds of mail in every mode (journals wrap: a 64 MiB one in about
    # 20 s at 100 commits per second; under pdc they are found).
    local pids=()
    for i in $(seq "$mails"); do
        mail_job "mail$i" "$WARM" /dev/null &
        pids+=($!)
    done
    wait "${pids[@]}"
    local found=0
    for i in $(seq "$mails"); do
        [ "$(metric ioshare_journal_groups "mail$i")" -ge 1 ] 2>/dev/null && found=$((found + 1))
    done
    for _ in 1 2; do dd if="$R/mnt/read/hot.dat" of=/dev/null bs=1M iflag=direct status=none; done
    log "bed $mode limit=${limit}MiB mails=$mails hot=${hot}MiB; journals found: $found of $mails"
}

# window TAG MODE LIMIT MAILS RUN: one measured window, one CSV line.
window() {
    local tag=$1 mode=$2 limit=$3 mails=$4 run=$5 d="$OUT/$1/$2-$3-$4-r$5" i
    mkdir -p "$d"
    local c0 r0 b0
    c0=($(cpu))
    r0=$(disk_reads)
    b0=$(metric ioshare_journal_bypassed_bytes_total mail1)
    local pids=()
    read_job "$WINDOW_S" "$d/read.json" &
    pids+=($!)
    for i in $(seq "$mails"); do
        mail_job "mail$i" "$WINDOW_S" "$d/mail$i.json" &
        pids+=($!)
    done
    wait "${pids[@]}"
    local c1 r1 b1
    c1=($(cpu))
    r1=$(disk_reads)
    b1=$(metric ioshare_journal_bypassed_bytes_total mail1)
    local busy=$(( 100 * (c1[0] - c0[0]) / ((c1[0] - c0[0]) + (c1[1] - c0[1]) + 1) ))
    local res_read res_mail=0 res_journal=0
    res_read=$(mib_resident "$R/read.img")
    for i in $(seq "$mails"); do
        res_mail=$(awk -v a="$res_mail" -v b="$(mib_resident "$R/mail$i.img")" 'BEGIN { print a + b }')
        res_journal=$(awk -v a="$res_journal" -v b="$(python3 bench/pdc-resident.py "$R/mail$i.img" "$R/mail$i.journal.txt")" 'BEGIN { print a + b }')
    done
    python3 - "$d" "$mails" "$WINDOW_S" "$((r1 - r0))" "$busy" "$res_read" "$res_mail" "$res_journal" "${b0:-0}" "${b1:-0}" \
        "$tag,$mode,$limit,$mails,$run" >> "$OUT/results.csv" <<'PY'
import json, sys
d, mails, secs, disk_sectors_read, busy, res_read, res_mail, res_journal, b0, b1, key = sys.argv[1:12]
mails, secs = int(mails), float(secs)
r = json.load(open(f"{d}/read.json"))["jobs"][0]
read_ios = r["read"]["total_ios"]
read_iops = read_ios / (r["read"]["runtime"] / 1000)
read_p99 = r["read"]["clat_ns"]["percentile"]["99.000000"] / 1000
ops, p50, p99 = [], [], []
for i in range(1, mails + 1):
    m = json.load(open(f"{d}/mail{i}.json"))["jobs"][0]
    ops.append((m["read"]["total_ios"] + m["write"]["total_ios"]) / secs)
    s = m["sync"]["lat_ns"]["percentile"]
    p50.append(s["50.000000"] / 1000)
    p99.append(s["99.000000"] / 1000)
# Disk reads in 4 KiB units over the read guest's reads: what the host cache missed.
disk_4k = int(disk_sectors_read) * 512 / 4096
hit = max(0.0, 1 - disk_4k / max(read_ios, 1))
print(",".join(str(x) for x in [
    key, round(read_iops), round(read_p99), round(sum(ops) / mails, 1),
    round(sum(p50) / mails), round(max(p99)), round(disk_4k), round(hit, 3),
    res_read, round(float(res_mail) / mails, 1), round(float(res_journal) / mails, 1), busy,
    round((int(b1) - int(b0)) / 1048576, 1)]))
PY
    tail -1 "$OUT/results.csv" >&2
}

CSV_HEADER="part,mode,limit_mib,mails,run,read_iops,read_p99_us,mail_ops_per_guest,fsync_p50_us,fsync_p99_us,disk_reads_4k,read_hit_ratio,host_cache_read_mib,host_cache_mail_mib_per_image,host_cache_journal_mib_per_image,cpu_busy_pct,mail1_bypassed_mib"
[ -f "$OUT/results.csv" ] || echo "$CSV_HEADER" > "$OUT/results.csv"

# --- accuracy -------------------------------------------------------------------------
accuracy() {
    : > "$OUT/accuracy.txt"
    local name size args
    for spec in "default:4g:" "16m:2g:-J size=16" "256m:4g:-J size=256"; do
        IFS=: read -r name size args <<< "$spec"
        THROTTLE=0 start_server pdc 100000 "g:$size" -- --capture "$R/capture.log"
        # shellcheck disable=SC2086
        guest g $args
        dbench -D "$R/mnt/g" -t "$ACC_SECONDS" 4 > "$R/dbench.txt" 2>&1
        down
        {
            echo "== journal $name ($size file system, dbench 4 for ${ACC_SECONDS} s)"
            "$BIN" journal-check "$R/capture.log" --extents "$R/g.journal.txt"
        } | tee -a "$OUT/accuracy.txt"
        "$BIN" journal-check "$R/capture.log" --extents "$R/g.journal.txt" --json > "$OUT/accuracy-$name.json"
        cp "$R/g.journal.txt" "$OUT/accuracy-$name.debugfs.txt"
        gzip -c "$R/capture.log" > "$OUT/accuracy-$name.iolog.gz"
        rm -f "$R/capture.log"
    done
}

# --- main and sweep ---------------------------------------------------------------------
setting() { # TAG LIMIT MAILS RUNS MODES...
    local tag=$1 limit=$2 mails=$3 runs=$4 mode r
    shift 4
    for mode in "$@"; do
        bed "$mode" "$limit" "$mails"
        for r in $(seq "$runs"); do window "$tag" "$mode" "$limit" "$mails" "$r"; done
        cp "$R/server.log" "$OUT/$tag/server-$mode-$limit-$mails.log"
        down
    done
}

for part in $PARTS; do
    case $part in
        accuracy) accuracy ;;
        # shellcheck disable=SC2086
        main) setting main "$LIMIT" "$MAILS" "$RUNS" $MODES ;;
        sweep)
            for l in $SWEEP_LIMITS; do
                for m in $SWEEP_MAILS; do
                    # shellcheck disable=SC2086
                    setting sweep "$l" "$m" "$SWEEP_RUNS" $SWEEP_MODES
                done
            done
            ;;
        *) echo "pdc.sh: unknown part '$part' (accuracy, main, sweep)" >&2; exit 2 ;;
    esac
done

# --- tables -------------------------------------------------------------------------------
python3 - "$OUT/results.csv" > "$OUT/tables.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cols = [("read_iops", "read IOPS"), ("read_p99_us", "read p99 µs"),
        ("mail_ops_per_guest", "mail ops/s per guest"), ("fsync_p50_us", "fsync p50 µs"),
        ("fsync_p99_us", "fsync p99 µs"), ("read_hit_ratio", "hit ratio"),
        ("disk_reads_4k", "disk reads (4 KiB)"), ("host_cache_read_mib", "cache: read image MiB"),
        ("host_cache_mail_mib_per_image", "cache: per mail image MiB"),
        ("host_cache_journal_mib_per_image", "cache: its journal MiB"), ("cpu_busy_pct", "CPU busy %")]
groups = {}
for r in rows:
    groups.setdefault((r["part"], int(r["limit_mib"]), int(r["mails"])), {}).setdefault(r["mode"], []).append(r)
def cell(vals):
    vals = [float(v) for v in vals]
    m = statistics.mean(vals)
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    fmt = "{:.3f}" if m < 2 else "{:.0f}" if m >= 100 else "{:.1f}"
    return (fmt + " ± " + fmt).format(m, sd)
for (part, limit, mails), modes in sorted(groups.items()):
    n = max(len(v) for v in modes.values())
    print(f"\n**{part}: cache limit {limit} MiB, {mails} mail guests, {n} windows per mode (mean ± sd)**\n")
    print("| mode | " + " | ".join(c[1] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for mode in ["writeback", "none", "pdc"]:
        if mode in modes:
            print(f"| {mode} | " + " | ".join(cell(r[c] for r in modes[mode]) for c, _ in cols) + " |")
    if "pdc" in modes and "writeback" in modes:
        wb = statistics.mean(float(r["read_iops"]) for r in modes["writeback"])
        pd = statistics.mean(float(r["read_iops"]) for r in modes["pdc"])
        mw = statistics.mean(float(r["mail_ops_per_guest"]) for r in modes["writeback"])
        mp = statistics.mean(float(r["mail_ops_per_guest"]) for r in modes["pdc"])
        print(f"\npdc / writeback: read IOPS {pd / wb:.2f}×, mail ops {mp / mw:.2f}×")
PY
cat "$OUT/tables.md"
log "results in $OUT (results.csv, tables.md, accuracy.txt, per-window fio JSON)"
