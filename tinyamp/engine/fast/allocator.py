"""Keeping freed memory for the next step: the C allocator's heap trimming, and how to stop it.

A training step allocates and frees the same large arrays at every step: activations,
gradients, and on a CPU the FP32 widenings of FP16 operands.  NumPy gets that memory from
the C library's ``malloc``.  glibc's ``malloc`` gives the free top of its heap back to the
kernel once it passes a threshold (it "trims"), so the next step's arrays land on fresh
pages, and the kernel zero-fills each 4 KiB page at its first touch: a page fault per
page.  Whether it happens depends on the sizes and order of earlier allocations; the
README ("Faster on a CPU") and benchmarks/README.md give the step times and page faults measured with and without.

``mallopt(M_TOP_PAD, n)`` asks glibc to keep n bytes at the top of the heap when it trims
(and to grow the heap n bytes at a time): the pages stay mapped and the faults go away.
Arrays above glibc's mmap threshold (128 KiB at first, raised as such blocks are freed)
get pages of their own from the kernel instead, fresh at every allocation; fixing the
threshold at 32 MiB, the most glibc itself would raise it to, keeps the arrays of a step
on the heap too (the NumPy-pass casts of tinyamp/engine/fast/casts.py allocate 256 KiB scratch
blocks).  The price is that up to n bytes of freed memory stay with the process.

It changes the whole process, so the library never does it on its own: the ``tinyamp``
command calls it for its training runs, and a script can call ``tinyamp.keep_freed_memory()``
itself (or set the environment variables ``MALLOC_TOP_PAD_`` and ``MALLOC_MMAP_THRESHOLD_``
before Python starts).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3  # glibc's mallopt parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems


def keep_freed_memory(megabytes: int = 64) -> bool:
    """Ask glibc's malloc to keep `megabytes` of freed memory mapped instead of trimming it,
    and to serve arrays below 32 MiB from its heap.

    Returns True when the setting was applied; False where there is no glibc (macOS,
    Windows, musl), and then nothing changes.
    """
    if not isinstance(megabytes, int) or isinstance(megabytes, bool) or not 0 <= megabytes <= 4096:
        raise ValueError(f"megabytes must be an int from 0 to 4096; got {megabytes!r}")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    padded = libc.mallopt(ctypes.c_int(M_TOP_PAD), ctypes.c_int(megabytes << 20))
    return bool(padded and libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD)))
