#!/usr/bin/env bash
# ceph-up.sh - a throw-away Ceph cluster on this one host, from Debian's ceph packages,
# with no systemd and no containers: one monitor, one manager and N OSDs (bluestore on
# sparse files), everything inside one directory, the way Ceph's own vstart.sh does for
# its developers. The RBD tests (tests/rbd.rs) and bench/cluster.sh use it.
#
# Usage:  CEPH_DIR=DIR [NUM_OSDS=3] [POOL_SIZE=NUM_OSDS] [OSD_GB=10] [PG_NUM=32]
#         [IMAGES="img:1024"] bench/ceph-up.sh
#   DIR must not exist yet. IMAGES: space-separated name:MiB images created in pool rbd.
# Then:   export CEPH_CONF=$CEPH_DIR/ceph.conf; ceph -s; rbd ls
# Stop:   CEPH_DIR=DIR bench/ceph-down.sh   (RM=1 also removes DIR)
# A failed start stops what it started (KEEP_ON_FAIL=1 keeps it to look at).
#
# Settings a one-host cluster needs (each is why a first try failed):
# * bluestore creates its own block file (`bluestore block create`); naming its path as
#   $osd_data/block fails mkfs with "Too many levels of symbolic links".
# * `auth allow insecure global id reclaim = false`, else HEALTH_WARN for ever.
# * Replicas on one host: `osd crush chooseleaf type = 0`; a nearly full root disk must not
#   stop the monitor: `mon data avail warn/crit`.
# * A loop-backed or virtual disk reports itself rotational: OSDs then sleep 0.1 s between
#   recovery operations; `osd recovery sleep * = 0`.
# * HEALTH_OK can come while placement groups are still unknown: wait for active+clean too.
# * OSD mkfs and start in parallel (each blocks about 4 s).
# * Two clients on one admin socket collide: a socket per client and process.
set -euo pipefail

DIR=${CEPH_DIR:?set CEPH_DIR to a directory that does not exist yet}
NUM_OSDS=${NUM_OSDS:-3}
POOL_SIZE=${POOL_SIZE:-$NUM_OSDS}
OSD_GB=${OSD_GB:-10}
PG_NUM=${PG_NUM:-32}
IMAGES=${IMAGES:-img:1024}
CONF=$DIR/ceph.conf
export CEPH_CONF=$CONF
HERE=$(cd "$(dirname "$0")" && pwd)
START=$(date +%s.%N)

die() { echo "ceph-up.sh: $*" >&2; exit 1; }
say() { printf 'ceph-up.sh: [%5.1fs] %s\n' "$(echo "$(date +%s.%N) - $START" | bc)" "$*"; }
cephc() { ceph --connect-timeout 15 "$@"; }
wait_for() {  # wait_for SECONDS WHAT COMMAND...
    local end=$(($(date +%s) + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || { echo "ceph-up.sh: timed out waiting for $what" >&2; return 1; }
        sleep 0.5
    done
}
json_ok() {  # json_ok PYTHON-EXPRESSION-ON-d : reads JSON on stdin
    python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if ($1) else 1)"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() {  # start TYPE ID... : each daemon forks once its start-up is done
    local type=$1 id pids=()
    shift
    for id in "$@"; do
        "ceph-$type" -c "$CONF" -i "$id" &
        pids+=($!)
    done
    for id in "${pids[@]}"; do wait "$id" || die "ceph-$type failed to start (logs in $DIR/log)"; done
    for id in "$@"; do wait_for 20 "$type.$id's pid file" test -s "$DIR/run/$type.$id.pid"; done
}

for tool in ceph-mon ceph-mgr ceph-osd ceph rbd monmaptool ceph-authtool uuidgen python3 bc; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install ceph-mon ceph-mgr ceph-osd ceph-common uuid-runtime bc)"
done
[ "$NUM_OSDS" -ge 1 ] && [ "$POOL_SIZE" -ge 1 ] && [ "$POOL_SIZE" -le "$NUM_OSDS" ] ||
    die "need 1 <= POOL_SIZE ($POOL_SIZE) <= NUM_OSDS ($NUM_OSDS)"
[ -e "$DIR" ] && die "$DIR exists; stop it with bench/ceph-down.sh and remove it first"
mkdir -p "$DIR"/{run,log,crash}
on_exit() {
    local rc=$?
    if [ $rc -ne 0 ] && [ "${KEEP_ON_FAIL:-0}" != 1 ]; then
        echo "ceph-up.sh: failed (exit $rc); logs in $DIR/log; stopping what started" >&2
        CEPH_DIR=$DIR "$HERE/ceph-down.sh" >&2 || true
    fi
}
trap on_exit EXIT

FSID=$(uuidgen)
P2=$(free_port)
P1=$(free_port)
while [ "$P1" = "$P2" ]; do P1=$(free_port); done
MON="[v2:127.0.0.1:$P2,v1:127.0.0.1:$P1]"
cat >"$CONF" <<EOF
[global]
fsid = $FSID
mon host = $MON
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
crash dir = $DIR/crash
osd pool default size = $POOL_SIZE
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1
mon osd min up ratio = 0

[client]
keyring = $DIR/keyring
admin socket = $DIR/run/\$name.\$pid.asok
rbd cache = false

[mon]
mon data = $DIR/\$name
keyring = $DIR/\$name/keyring
mon cluster log file = $DIR/log/cluster.log
mon memory target = 536870912

[mgr]
mgr data = $DIR/\$name
keyring = $DIR/\$name/keyring

[osd]
osd data = $DIR/\$name
keyring = $DIR/\$name/keyring
osd memory target = 1073741824
osd recovery sleep hdd = 0
osd recovery sleep ssd = 0
osd recovery sleep hybrid = 0
osd objectstore = bluestore
bluestore block create = true
bluestore block size = $((OSD_GB * 1024 * 1024 * 1024))
bluestore fsck on mount = false
EOF

ceph-authtool --create-keyring "$DIR/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
ceph-authtool "$DIR/mon.keyring" --import-keyring "$DIR/keyring" >/dev/null
monmaptool --create --addv a "$MON" --fsid "$FSID" "$DIR/monmap" >/dev/null
mkdir -p "$DIR/mon.a"
ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring" \
    >"$DIR/log/mon.a.mkfs.out" 2>&1 || { cat "$DIR/log/mon.a.mkfs.out" >&2; die "ceph-mon --mkfs failed"; }
start mon a
wait_for 60 "the monitor's quorum" cephc quorum_status
say "monitor up"
cephc osd pool create rbd "$PG_NUM" "$PG_NUM" replicated --size "$POOL_SIZE" >/dev/null

mkdir -p "$DIR/mgr.x"
cephc auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' >"$DIR/mgr.x/keyring"
start mgr x

ids=() mkfs=()
for _ in $(seq "$NUM_OSDS"); do
    uuid=$(uuidgen)
    secret=$(ceph-authtool --gen-print-key)
    id=$(echo "{\"cephx_secret\": \"$secret\"}" | cephc osd new "$uuid" -i -)
    mkdir -p "$DIR/osd.$id"
    printf '[osd.%s]\n\tkey = %s\n' "$id" "$secret" >"$DIR/osd.$id/keyring"
    ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$uuid" >"$DIR/log/osd.$id.mkfs.out" 2>&1 &
    ids+=("$id")
    mkfs+=($!)
done
for i in "${!ids[@]}"; do
    wait "${mkfs[$i]}" || { tail -20 "$DIR/log/osd.${ids[$i]}.mkfs.out" >&2; die "ceph-osd --mkfs failed for osd.${ids[$i]}"; }
done
start osd "${ids[@]}"
wait_for 120 "$NUM_OSDS OSD(s) up and in" sh -c "ceph --connect-timeout 15 osd stat -f json | python3 -c \"import json,sys; d=json.load(sys.stdin); sys.exit(0 if d['num_up_osds']==$NUM_OSDS and d['num_in_osds']==$NUM_OSDS else 1)\""
say "$NUM_OSDS OSD(s) up"

rbd pool init rbd
for spec in $IMAGES; do
    rbd create "rbd/${spec%%:*}" --size "${spec#*:}M"
done
clean() {
    cephc pg stat -f json | json_ok "len(d['pg_summary']['num_pg_by_state'])==1 and d['pg_summary']['num_pg_by_state'][0]['name']=='active+clean'"
}
wait_for 180 "every placement group active+clean" clean
wait_for 120 "HEALTH_OK" sh -c "ceph --connect-timeout 15 health | grep -q '^HEALTH_OK'" || { cephc health detail >&2; exit 1; }
say "HEALTH_OK, images: $IMAGES"
echo "CEPH_CONF=$CONF"
