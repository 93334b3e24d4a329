#!/usr/bin/env bash
# rbd.sh - the rbd backend's throughput against librbd's own (`rbd bench`), A/B in one
# run on one throw-away cluster (bench/ceph-up.sh): 4 KiB random reads and writes and
# 64 KiB sequential writes at the same queue depth, each pattern `rbd bench`, fio's own
# rbd engine (librbd in fio's process), then fio through `ioshare serve` (fio's nbd
# engine on a Unix socket, policy none), ROUNDS times in turn. Prints IOPS per run and
# ioshare's ratios to both.
#
# Usage: [NUM_OSDS=3] [DEPTH=16] [SECONDS_EACH=10] [ROUNDS=2] [THREADS=n]
#        [PATTERNS="randread randwrite seqwrite"] bench/rbd.sh
#   THREADS sets the server's engine threads (server.threads; default: its own).
# Needs Ceph's packages (ceph-mon, ceph-osd, ceph-mgr, ceph-common), fio, bc and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
NUM_OSDS=${NUM_OSDS:-3}
DEPTH=${DEPTH:-16}
SECS=${SECONDS_EACH:-10}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-}
# pattern: name rbd-type rbd-pattern fio-rw size
ALL="randread:read:rand:randread:4K randwrite:write:rand:randwrite:4K seqwrite:write:seq:write:64K"
PATTERNS=$(for p in ${PATTERNS:-randread randwrite seqwrite}; do
    match=$(tr ' ' '\n' <<<"$ALL" | grep "^$p:") || { echo "unknown pattern $p (randread, randwrite, seqwrite)" >&2; exit 1; }
    echo "$match"
done)
BIN=${IOSHARE:-target/release/ioshare}
[ -x "$BIN" ] || cargo build --release
WORK=$(mktemp -d /tmp/ioshare-rbd.XXXXXX)
export CEPH_DIR=$WORK/c
cleanup() {
    [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null
    bench/ceph-down.sh >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
NUM_OSDS=$NUM_OSDS IMAGES="img:2048" bench/ceph-up.sh >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; exit 1; }
CONF=$CEPH_DIR/ceph.conf
# A never-written image is slow to write (objects are created): fill it first.
rbd -c "$CONF" bench --io-type write --io-size 4M --io-threads 8 --io-total 2G --io-pattern seq rbd/img >/dev/null

cat >"$WORK/serve.toml" <<EOF
[server]
unix = "$WORK/s.sock"
interval_s = 0
queue_depth = 64
${THREADS:+threads = $THREADS}
[backend]
kind = "rbd"
conf = "$CONF"
[[tenant]]
name = "img"
image = "img"
EOF
"$BIN" serve "$WORK/serve.toml" 2>"$WORK/serve.log" &
SERVER=$!
for _ in $(seq 100); do [ -S "$WORK/s.sock" ] && break; sleep 0.1; done

rbd_iops() {  # TYPE PATTERN SIZE: IOPS over SECS
    local total
    total=$((SECS * 4000 * 4096 / $(numfmt --from=iec "$3")))   # more than SECS can do
    [ "$total" -lt 1000 ] && total=1000
    timeout $((SECS + 60)) rbd -c "$CONF" bench --io-type "$1" --io-pattern "$2" --io-size "$3" \
        --io-threads "$DEPTH" --io-total "$(( total * $(numfmt --from=iec "$3") ))" rbd/img 2>/dev/null |
        awk '/^elapsed:/ { for (i = 1; i <= NF; i++) if ($i == "ops/sec:") print $(i + 1) }'
}
fio_iops() {  # RW SIZE [ENGINE ARGS...]: fio through ioshare, or with the engine given
    local rw=$1 bs=$2
    shift 2
    [ $# -gt 0 ] || set -- --ioengine=nbd --uri="nbd+unix:///img?socket=$WORK/s.sock"
    CEPH_CONF=$CONF fio --name=b "$@" --rw="$rw" --bs="$bs" \
        --iodepth="$DEPTH" --size=2G --time_based --runtime="$SECS" --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}
printf '%-10s %5s %10s %10s %10s %7s %7s\n' pattern round "rbd bench" "fio rbd" ioshare ratio "vs fio"
for p in $PATTERNS; do
    IFS=: read -r name rtype rpat frw size <<<"$p"
    for r in $(seq "$ROUNDS"); do
        a=$(rbd_iops "$rtype" "$rpat" "$size")
        f=$(fio_iops "$frw" "$size" --ioengine=rbd --clientname=admin --pool=rbd --rbdname=img)
        b=$(fio_iops "$frw" "$size")
        printf '%-10s %5s %10.0f %10.0f %10.0f %7.2f %7.2f\n' "$name" "$r" "$a" "$f" "$b" \
            "$(echo "$b / $a" | bc -l)" "$(echo "$b / $f" | bc -l)"
    done
done
echo "cluster: $NUM_OSDS OSD(s), pool size $NUM_OSDS, depth $DEPTH, ${SECS}s each; server threads ${THREADS:-default}; $(nproc) CPUs, $(uname -r)"
