#!/usr/bin/env bash
# Trace reading speed and memory. A generated MSR trace (random 4-64 KiB requests over
# 16 GiB on 4 disks, 70 % reads) of LINES lines is written to a temporary file and read
# by `wc -l` (the baseline: the cost of the bytes), `ioshare trace convert --to msr` to
# /dev/null (parse and format) and `ioshare trace stats` (parse and every figure), each
# timed with user+system CPU (one core: the reader is one thread) and peak RSS. Then
# the memory check: `trace stats` on 10x the lines, streamed from the generator through
# a pipe, must peak at the same RSS.
# Usage: bench/trace.sh [LINES]   (default 10000000)
set -euo pipefail
cd "$(dirname "$0")/.."
lines=${1:-10000000}
cargo build --release --quiet
bin=./target/release/ioshare
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gen() {
    awk -v n="$1" 'BEGIN {
        srand(7); t = 1e15;
        for (i = 0; i < n; i++) {
            t += int(rand() * 20000);
            printf "%.0f,src1,%d,%s,%.0f,%d,%d\n", t, i % 4, (rand() < 0.7 ? "Read" : "Write"),
                int(rand() * 4194304) * 4096, 4096 * (1 + int(rand() * 16)), int(rand() * 10000)
        }
    }'
}
gen "$lines" >"$dir/t.csv"
size=$(stat -c %s "$dir/t.csv")
echo "== $lines lines, $((size / 1048576)) MiB, on $(nproc) cores of $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
measure() { # LABEL CMD...: CPU seconds, lines per CPU second, peak RSS
    local label=$1
    shift
    /usr/bin/time -f "%U %S %M" -o "$dir/time" "$@" >/dev/null 2>"$dir/err" || { cat "$dir/err"; exit 1; }
    read -r user sys rss <"$dir/time"
    awk -v l="$label" -v u="$user" -v s="$sys" -v r="$rss" -v n="$lines" \
        'BEGIN { c = u + s; printf "%-28s %7.2f s CPU  %6.2f M lines/s  peak RSS %6.1f MiB\n", l, c, n / c / 1e6, r / 1024 }'
}
measure "wc -l" wc -l "$dir/t.csv"
measure "trace convert --to msr" "$bin" trace convert "$dir/t.csv" /dev/null --to msr --format msr
measure "trace stats" "$bin" trace stats "$dir/t.csv" --format msr
echo "== memory: trace stats on a stream of N and 10 N lines (from the generator, through a pipe)"
for n in "$lines" "$((lines * 10))"; do
    gen "$n" | /usr/bin/time -f "%M" -o "$dir/rss" "$bin" trace stats /dev/stdin --format msr >/dev/null 2>"$dir/err"
    echo "$n lines: peak RSS $(( $(cat "$dir/rss") / 1024 )) MiB"
done
