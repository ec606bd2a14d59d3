"""Freed heap kept for reuse, for a process that reads prefixes over and over.

Each record `get` returns is a fresh bytes object of a megabyte or more.
When a caller lets a prefix's records go, glibc gives the freed memory at
the top of its heap back to the kernel once it passes a threshold of a few
megabytes, so the next prefix lands in pages the kernel must fault in and
zero again, one by one: that, not the network, can be most of `get`'s time.
The same setting as kvtier-cache's own (services/base/heap_reuse.h), but
opt-in: it is a setting of the whole process, which a library should not
change behind its caller's back.
"""
import ctypes

_M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
_MOST_KEPT = 1 << 30  # mallopt takes an int
_MOST_MMAP_THRESHOLD = 32 << 20  # glibc's bound on 64-bit machines


def keep_freed_heap(kept_bytes=_MOST_KEPT):
    """Keeps up to `kept_bytes` of freed memory at the heap's top for the
    next allocations (glibc gives all of it back once more than that is
    free there: keep at least what one read holds, a prefix's records),
    and serves blocks up to half of that (at most 32 MiB) from the heap
    rather than a mapping of their own. True once set; False where the C
    library does not take these settings (not glibc), with nothing
    changed. The process's memory then stays at its peak."""
    if not 2 <= kept_bytes <= _MOST_KEPT:
        raise ValueError(f"kept_bytes must be 2 to {_MOST_KEPT}, got {kept_bytes}")
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Setting either also stops glibc from moving both on its own.
    return (mallopt(_M_MMAP_THRESHOLD, min(kept_bytes // 2, _MOST_MMAP_THRESHOLD)) == 1
            and mallopt(_M_TRIM_THRESHOLD, kept_bytes) == 1)
