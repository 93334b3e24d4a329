#!/usr/bin/env bash
# TLS against the clear, in one run: nbdcopy writes SIZE into an export and reads it
# back over TCP on loopback, from a clear server, one with an X.509 certificate
# (rustls) and one with a pre-shared key (OpenSSL), and for reference nbdkit's file
# plugin clear and with TLS in its own process (GnuTLS, no relay); every copy compared
# with its source. Prints MiB/s per round and, over the rounds after the first (a
# warm-up), the ratio of each TLS kind to its server's clear.
#
#   bench/tls.sh
#   ROUNDS=5 SIZE=2g THREADS=1 bench/tls.sh
#
# Environment: SIZE (1g), ROUNDS (3; the first is a warm-up), KINDS ("clear cert psk
# nbdkit nbdkit-tls"),
# THREADS (server.threads; unset: the default), CONNECTIONS (nbdcopy's, 4), IOSHARE (the
# binary, default this tree's release build), OUT (also append the table to this file).
# The images and copies live in a temporary folder on /dev/shm (tmpfs), removed at the
# end.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${SIZE:-1g}
ROUNDS=${ROUNDS:-3}
KINDS=${KINDS:-"clear cert psk nbdkit nbdkit-tls"}
THREADS=${THREADS:-}
CONNECTIONS=${CONNECTIONS:-4}
IOSHARE=${IOSHARE:-}

source bench/common.sh
install_tools nbdcopy:libnbd-bin nbdinfo:libnbd-bin openssl:openssl fio:fio nbdkit:nbdkit
IOSHARE=$(ioshare_binary "$IOSHARE")
DIR=$(mktemp -d /dev/shm/ioshare-tls.XXXXXX)
cleanup() {
    stop_server
    [ -n "${KEEP:-}" ] || rm -rf "$DIR"
}
trap cleanup EXIT
bytes=$(fill_file "$DIR/source.img" "$SIZE")
PORT=$((20000 + RANDOM % 20000))

# A self-signed certificate for localhost and 127.0.0.1 (libnbd trusts it as the CA in
# its certificate folder) and a pre-shared key.
mkdir -p "$DIR/pki"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$DIR/pki/server-key.pem" -out "$DIR/pki/server-cert.pem" 2>/dev/null
cp "$DIR/pki/server-cert.pem" "$DIR/pki/ca-cert.pem"
echo "alice:$(openssl rand -hex 32)" >"$DIR/keys.psk"

# start KIND: a server on $PORT serving export "disk" ($SIZE on tmpfs).
start() {
    local tls=""
    if [[ $1 == nbdkit* ]]; then
        rm -f "$DIR/disk.img"
        truncate -s "$bytes" "$DIR/disk.img"
        PORT=$((PORT + 1))
        local opts=()
        [ "$1" = nbdkit-tls ] && opts=(--tls=require "--tls-certificates=$DIR/pki")
        nbdkit --foreground --port "$PORT" --exportname disk "${opts[@]}" \
            file "$DIR/disk.img" 2>"$DIR/server.log" &
        wait_for_export "$(uri "$1")" "$DIR/server.log"
        return
    fi
    case $1 in
    clear) ;;
    cert) tls=$(printf 'tls = "require"\ntls_cert = "%s"\ntls_key = "%s"' \
        "$DIR/pki/server-cert.pem" "$DIR/pki/server-key.pem") ;;
    psk) tls=$(printf 'tls = "require"\ntls_psk = "%s"' "$DIR/keys.psk") ;;
    esac
    # A fresh image each time.
    remove_image "$DIR/disk.img"
    # A port of its own: the last server's may still be held by closing connections.
    PORT=$((PORT + 1))
    cat >"$DIR/serve.toml" <<EOF
[server]
tcp = "127.0.0.1:$PORT"
interval_s = 0
${THREADS:+threads = $THREADS}
$tls
[[tenant]]
name = "disk"
file = "$DIR/disk.img"
create = true
size = $bytes
EOF
    "$IOSHARE" serve "$DIR/serve.toml" 2>"$DIR/server.log" &
    wait_for_export "$(uri "$1")" "$DIR/server.log"
}

uri() {
    case $1 in
    clear | nbdkit) echo "nbd://127.0.0.1:$PORT/disk" ;;
    nbdkit-tls) echo "nbds://localhost:$PORT/disk?tls-certificates=$DIR/pki" ;;
    cert) echo "nbds://localhost:$PORT/disk?tls-certificates=$DIR/pki" ;;
    psk) echo "nbds://alice@127.0.0.1:$PORT/disk?tls-psk-file=$DIR/keys.psk" ;;
    esac
}

# copy FROM TO: seconds nbdcopy took.
copy() {
    local t0 t1
    t0=$(date +%s.%N)
    nbdcopy --connections="$CONNECTIONS" "$1" "$2"
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}

declare -A mibs=()
for round in $(seq "$ROUNDS"); do
    for kind in $KINDS; do
        start "$kind"
        u=$(uri "$kind")
        w=$(copy "$DIR/source.img" "$u")
        rm -f "$DIR/back.img"
        r=$(copy "$u" "$DIR/back.img")
        cmp "$DIR/source.img" "$DIR/back.img" || { echo "$kind: the copy differs" >&2; exit 1; }
        stop_server
        mibs[$round,$kind,write]=$(awk -v s="$w" -v b="$bytes" 'BEGIN { printf "%.0f", b / 1048576 / s }')
        mibs[$round,$kind,read]=$(awk -v s="$r" -v b="$bytes" 'BEGIN { printf "%.0f", b / 1048576 / s }')
        echo "round $round $kind: write ${mibs[$round,$kind,write]} MiB/s, read ${mibs[$round,$kind,read]} MiB/s" >&2
    done
done

table() {
    echo "# $(date -u +%F) $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(uname -r), libnbd $(nbdcopy --version | awk '/libnbd/ { print $2 }'), $SIZE, $CONNECTIONS connections${THREADS:+, server.threads $THREADS}"
    echo
    echo "| | write MiB/s (rounds 2..$ROUNDS) | read MiB/s (rounds 2..$ROUNDS) | write / its clear | read / its clear |"
    echo "|---|---|---|---|---|"
    for kind in $KINDS; do
        local w="" r="" wsum=0 rsum=0 csw=0 csr=0
        for round in $(seq 2 "$ROUNDS"); do
            w+="${w:+, }${mibs[$round,$kind,write]}"
            r+="${r:+, }${mibs[$round,$kind,read]}"
            wsum=$((wsum + mibs[$round,$kind,write]))
            rsum=$((rsum + mibs[$round,$kind,read]))
            # Each kind against its own server's clear.
            local base=clear
            [[ $kind == nbdkit* ]] && base=nbdkit
            if [[ " $KINDS " == *" $base "* ]]; then
                csw=$((csw + mibs[$round,$base,write]))
                csr=$((csr + mibs[$round,$base,read]))
            fi
        done
        echo "| $kind | $w | $r | $(awk -v a=$wsum -v b=$csw 'BEGIN { print b ? sprintf("%.2f", a / b) : "–" }') | $(awk -v a=$rsum -v b=$csr 'BEGIN { print b ? sprintf("%.2f", a / b) : "–" }') |"
    done
}
table | tee -a "${OUT:-/dev/null}"
