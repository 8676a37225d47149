"""Keep the memory of the quantizer's temporaries in the process between chunks (glibc only).

The vectorized quantizers build a few MiB of numpy temporaries per chunk and free them at its
end. glibc's malloc serves blocks of that size from the heap but, by default, gives the top of
the heap back to the kernel as soon as more than about twice the largest recently freed block
is free there (and maps blocks above its adaptive threshold afresh each time), so the next chunk
touches fresh pages: one page fault per 4 KiB. Measured on the development VM, in a process
that had not yet freed a block larger than a chunk's temporaries (after that, glibc's adaptive
thresholds rise and the faults stop), that was 11,000-18,000 faults per million K-quant values
and a fifth to a third of their CPU time. ggml's C quantizer writes into buffers it was given
and pays nothing of the kind.

`keep_freed_memory()` sets two malloc parameters once per process: blocks below MMAP_THRESHOLD
come from the heap, and up to TRIM_THRESHOLD of free memory at its top stays mapped. Peak memory
is unchanged (what stays mapped was in use a moment before); what changes is that the resident
size no longer drops between chunks. Tensor pieces (16 MiB) and larger arrays stay above the
threshold, so they are still mapped and unmapped on their own and never fragment the heap.
Where malloc is not glibc's (macOS, musl, Windows), or where the user tuned malloc through its
MALLOC_*_ environment variables, nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading

# above a Q3_K chunk's float32 arrays (2M values: 8 MiB), below a tensor piece (16 MiB)
MMAP_THRESHOLD = 12 << 20
TRIM_THRESHOLD = 64 << 20
# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_done = False


def keep_freed_memory() -> None:
    """Apply the two malloc parameters, once per process; a no-op outside glibc."""
    global _done
    if _done:
        return
    with _lock:
        if _done:
            return
        _done = True
        if not sys.platform.startswith("linux") or any(
            name in os.environ for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
        ):
            return
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt)
            return
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
