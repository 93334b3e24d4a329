#!/usr/bin/env bash
# Runs ioshare's tests. Installs what the tests need when it is missing, then `cargo test`.
set -euo pipefail
cd "$(dirname "$0")"

# System packages used by the tests that talk to real NBD clients (live server), put a
# file system on an export (nbdfuse, losetup, mkfs.ext4), look at report.html in a
# browser (chromium, headless) and serve images of a throw-away Ceph cluster
# (bench/ceph-up.sh: ceph-mon, ceph-osd, ceph-mgr, ceph-common; librbd comes with them).
need=()
for pair in fio:fio qemu-img:qemu-utils nbdinfo:libnbd-bin nbdfuse:libnbd-bin nbdkit:nbdkit \
    mkfs.ext4:e2fsprogs losetup:mount chromium:chromium \
    ceph-mon:ceph-mon ceph-osd:ceph-osd ceph-mgr:ceph-mgr ceph:ceph-common rbd:ceph-common \
    uuidgen:uuid-runtime bc:bc; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
# Building needs OpenSSL's headers (TLS with pre-shared keys).
if ! pkg-config --exists openssl 2>/dev/null; then
    need+=(libssl-dev pkg-config)
fi
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test.sh: installing ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        # A failed install is reported, not fatal: only the live-server tests need these.
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
            echo "test.sh: could not install ${need[*]}; tests needing them will fail" >&2
    else
        echo "test.sh: missing ${need[*]} (install them, or run as root with apt-get); tests needing them will fail" >&2
    fi
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "test.sh: cargo not found; install Rust (https://rustup.rs)" >&2
    exit 1
fi

# Tests that cannot run here (no loop devices, no chromium) pass without running; each
# writes why into this file, and the summary below lists them, so a skip is never
# mistaken for a pass.
skipped=$(mktemp)
trap 'rm -f "$skipped"' EXIT
export IOSHARE_SKIPPED_LOG=$skipped
status=0
cargo test --release "$@" || status=$?
# The live tests start their servers with two engine threads; once more with one.
if [ $# -eq 0 ]; then
    IOSHARE_TEST_THREADS=1 cargo test --release --test live || status=$?
fi
if [ -s "$skipped" ]; then
    echo "test.sh: $(wc -l <"$skipped") test(s) skipped, passing without running:"
    sed 's/^/  /' "$skipped"
else
    echo "test.sh: no test skipped"
fi
exit "$status"
