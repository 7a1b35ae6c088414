"""Keep freed heap memory in this process (glibc malloc), so that the buffers a step allocates and frees
are not page-faulted afresh at every step.

A decode step allocates the same large outputs every time (the logits head's [M, 49152] fp32 rows:
1.5 MB at M = 8; 196 KB at M = 1) and frees them. glibc serves blocks above its dynamic mmap threshold (128 KB at
first) from fresh mappings, and gives the top of its heap back to the system once more than twice that
lies free there, so such a block keeps coming back as new pages: at M = 8, 352 page faults and about
0.9 ms on a 4.3 ms head product, in an interleaved run of the route against the same kernel called in a
C loop (``bench/NOTEBOOK.md``). With blocks up to 32 MB taken from the heap and no trimming, freed memory
is used again; the process keeps the largest heap it had (as tcmalloc or jemalloc do).

``SGLANG_SSD_CPU_MALLOC=default`` leaves glibc's policy alone; other C libraries are left alone anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for it on 64-bit systems
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Apply the policy above once per process; whether it is in force."""
    setting = os.environ.get("SGLANG_SSD_CPU_MALLOC", "keep")
    if setting not in ("keep", "default"):
        raise ValueError(f"SGLANG_SSD_CPU_MALLOC={setting!r}: expected keep or default")
    on = setting == "keep"
    if on:
        try:
            mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            on = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        except (OSError, AttributeError):  # not glibc
            on = False
    if on:
        print(f"sglang_ssd: CPU malloc keeps freed memory in the process (glibc mmap threshold 32 MB, no trim; "
              f"SGLANG_SSD_CPU_MALLOC=default to leave glibc alone; pid {os.getpid()})", file=sys.stderr, flush=True)
    return on
