# Sourced by the bench scripts: installing tools, NBD servers, writing into the docs.

# install_tools CMD:PACKAGE ...: installs the Debian packages of the commands that are
# missing (as root with apt-get), or stops.
install_tools() {
    local need=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing ${need[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "missing ${need[*]}: install them (or run as root with apt-get)" >&2
        exit 1
    fi
}

# ioshare_binary [PATH]: PATH when given, else this tree's release build (built first).
ioshare_binary() {
    if [ -n "${1:-}" ]; then
        echo "$1"
    else
        cargo build --release --quiet >&2
        echo target/release/ioshare
    fi
}

# remove_image FILE...: removes served image files and the marker the server leaves
# beside each (".NAME.ioshare"; without it a server refuses to serve an empty image in
# place of one it created before, which is what a bench that starts afresh wants).
remove_image() {
    local f
    for f in "$@"; do
        rm -f "$f" "$(dirname "$f")/.$(basename "$f").ioshare"
    done
}

# fill_file FILE SIZE [DIRECT]: writes SIZE (fio's notation, e.g. 1g) to FILE unless it
# holds that many bytes already, fully allocated, so that no run measures block
# allocation; DIRECT=1 writes with O_DIRECT. Prints the size in bytes.
fill_file() {
    local file=$1 size=$2 direct=${3:-0} bytes
    bytes=$(numfmt --from=iec "${size^^}")
    if [ "$(stat -c %s "$file" 2>/dev/null || echo 0)" != "$bytes" ]; then
        echo "writing $size to $file" >&2
        rm -f "$file"
        fio --name=fill --filename="$file" --rw=write --bs=1m --size="$size" \
            --ioengine=psync --direct="$direct" --output=/dev/null
    fi
    echo "$bytes"
}

# The server started last in the background; stop_server ends it (also on exit).
server_pid=
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=
    fi
}
trap stop_server EXIT

# wait_for_export URI LOG: records $! as the server and waits (30 s at most) until URI
# answers; stops with a pointer to LOG if it never does.
wait_for_export() {
    server_pid=$!
    for _ in $(seq 600); do
        nbdinfo --size "$1" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "the server did not start; see $2" >&2
    exit 1
}

# write_between_markers FILE START END TEXT: replaces what FILE holds between the lines
# START and END with TEXT (passed on standard input: a table can be larger than one
# argument may be).
write_between_markers() {
    printf '%s' "$4" | python3 -c '
import sys
path, start, end = sys.argv[1:4]
text = sys.stdin.read()
doc = open(path).read()
a = doc.index(start) + len(start) + 1
b = doc.index(end)
open(path, "w").write(doc[:a] + text + "\n" + doc[b:])
' "$1" "$2" "$3"
}
