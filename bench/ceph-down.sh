#!/usr/bin/env bash
# ceph-down.sh - stops the cluster bench/ceph-up.sh started in CEPH_DIR, by the PIDs in
# its run/ directory (each checked to be a ceph daemon of this cluster's ceph.conf):
# the OSDs first, while the monitor can still take their shutdown, then the manager and
# the monitor. KILL=1 kills without a clean shutdown; RM=1 also removes CEPH_DIR.
set -uo pipefail
DIR=${CEPH_DIR:?set CEPH_DIR to the cluster directory}
CONF=$DIR/ceph.conf
SIG=TERM
[ "${KILL:-0}" = 1 ] && SIG=KILL
stopped=0
alive() { [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]; }
stop() {  # stop GLOB... : signals the matching daemons, waits (SIGKILL after 30 s)
    local pids=() f pid g end
    for g in "$@"; do
        for f in "$DIR"/run/$g.pid; do
            [ -s "$f" ] || continue
            pid=$(cat "$f")
            if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "-c $CONF"; then
                kill -"$SIG" "$pid" 2>/dev/null && pids+=("$pid")
            fi
        done
    done
    end=$(($(date +%s) + 30))
    for pid in "${pids[@]}"; do
        while alive "$pid"; do
            if [ "$(date +%s)" -ge "$end" ]; then
                kill -KILL "$pid" 2>/dev/null
                break
            fi
            sleep 0.05
        done
    done
    stopped=$((stopped + ${#pids[@]}))
}
stop 'osd.*'
stop 'mgr.*' 'mon.*'
echo "ceph-down.sh: stopped $stopped daemon(s) of $DIR"
if [ "${RM:-0}" = 1 ]; then rm -rf "$DIR"; fi
exit 0
