"""Keeping compiled programs from exhausting the process's memory mappings.

Every executable XLA loads maps its machine code into the process (about a dozen mappings each
on the CPU backend), and a program cached here keeps its executable loaded. Linux allows a
process `vm.max_map_count` mappings (65,530 by default); past it the next `mmap` fails, and XLA's
compiler and executable loader do not survive that: the process dies of a segmentation fault
inside `backend_compile_and_load` or `deserialize_executable`. A test worker of our suite met it
after about 5,000 programs, and so would a long notebook session that keeps meeting new shapes.

So on a cache miss, now and then, the mappings are counted; past half the limit the in-memory
caches (deferfuse's and JAX's) are emptied, which unloads every executable nothing else holds.
What is still in use recompiles on its next call (the persistent cache makes that a load). The
reset is counted (`metrics()["cache_resets"]`), reported, and warned about once: a process that
needs this many programs is usually recompiling for shapes that keep changing.
"""
from __future__ import annotations

import functools

_EVERY = 64  # misses between counts: a count reads /proc/self/maps (milliseconds at 30k lines)
_FRACTION = 0.5
_misses = 0


@functools.cache
def _limit() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):  # not Linux: no such limit to watch
        return None


def mappings() -> int:
    with open("/proc/self/maps", "rb") as f:
        return sum(1 for _ in f)


def too_many() -> int | None:
    """The process's mapping count when it is past the threshold (checked every _EVERY-th call),
    else None."""
    global _misses
    _misses += 1
    if _misses % _EVERY or _limit() is None:
        return None
    n = mappings()
    return n if n > _FRACTION * _limit() else None
