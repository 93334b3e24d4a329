#!/usr/bin/env python3
"""resident.py IMAGE DEBUGFS_TXT [BLOCK]: MiB of the journal's blocks in the host's page cache (mincore)."""
import ctypes, mmap, os, re, sys
libc = ctypes.CDLL("libc.so.6", use_errno=True)
path, dbg = sys.argv[1], sys.argv[2]
block = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
ranges = []
for m in re.finditer(r"\((\d+)(?:-\d+)?\):(\d+)(?:-(\d+))?", open(dbg).read().split("EXTENTS:")[-1]):
    a, b = int(m.group(2)), int(m.group(3) or m.group(2))
    ranges.append((a * block, (b + 1) * block))
page = os.sysconf("SC_PAGE_SIZE")
total = 0
with open(path, "rb") as f:
    for a, b in ranges:
        mm = mmap.mmap(f.fileno(), b - a, access=mmap.ACCESS_COPY, offset=a)
        ptr = ctypes.c_char.from_buffer(mm)
        vec = (ctypes.c_ubyte * ((b - a + page - 1) // page))()
        if libc.mincore(ctypes.c_void_p(ctypes.addressof(ptr)), ctypes.c_size_t(b - a), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        total += sum(v & 1 for v in vec) * page
        del ptr
        mm.close()
print(f"{total / 1048576:.1f}")
