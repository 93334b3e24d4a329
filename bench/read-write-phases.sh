#!/usr/bin/env bash
# Reads and writes in separate phases on the aged SSD presets, under no policy: a 4 KiB
# random reader and a 4 KiB random writer (iodepth 32 each, device queue 32), taking
# turns of PHASE milliseconds, so the device holds only one kind of request at a time
# (but for the drain at each turn). Compare with `scenarios/read-write-mix.toml`, where
# readers and a writer share the queue at once: 0.79-0.82 s/s of device work.
# Usage: bench/read-write-phases.sh [PHASE_MS ...]   (default: 5 20 50)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(5 20 50)
for ms in "${phases[@]}"; do
    python3 - "$ms" >"$dir/phases-$ms.toml" <<'PY'
import sys
ms = float(sys.argv[1])
d = ms / 1000.0
turns = int(5.0 / (2 * d)) + 2  # 1 s of warm-up and 4 measured, whole turns
def turn(pattern, idle):
    extra = "idle = true, " if idle else "iodepth = 32, "
    return f'{{ {extra}pattern = "{pattern}", size = "4k", duration_s = {d} }}'
def tenant(name, pattern, first_idle):
    phases = []
    for _ in range(turns):
        pair = [turn(pattern, True), turn(pattern, False)]
        phases += pair if first_idle else pair[::-1]
    return f'[[tenant]]\nname = "{name}"\nworkload = {{ phases = [{", ".join(phases)}] }}\n'
print(f'''name = "read-write-phases-{sys.argv[1]}ms"
seed = 1
duration_s = 4
warmup_s = 1
policies = ["none"]
queue_depth = 32
[device]
model = "ssd"
preset = "nvme-p4500"
precondition = "aged"
capacity_gib = 4
write_buffer_mib = 0
''')
print(tenant("reader", "randread", True))
print(tenant("writer", "randwrite", False))
print('[sweep]\n"device.preset" = ["sata-840pro", "nvme-p4500"]')
PY
    echo "== turns of $ms ms"
    ./target/release/ioshare sim "$dir/phases-$ms.toml" --out "$dir/out-$ms" | grep -E "^-- |summary"
done
echo "== at once (scenarios/read-write-mix.toml)"
./target/release/ioshare sim scenarios/read-write-mix.toml --out "$dir/out-mix" | grep -E "^-- |summary"
