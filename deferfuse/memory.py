"""Device memory, as `torch.tpu.memory_allocated()` and friends report it (and
`torch.accelerator`'s, whose C++ allocator a Python backend does not have).

A backend that counts its own memory (TPU, GPU) answers from JAX's `memory_stats()`: bytes in
use, the peak, the limit. The CPU backend keeps no such count, so there the bytes in use are
those of the live arrays JAX holds on the device, and the peak is the largest figure this module
has seen when asked (it cannot see between two calls).
"""
from __future__ import annotations

import jax

_peak = 0


def _stats(device: jax.Device) -> dict | None:
    try:
        return device.memory_stats()
    except Exception:  # noqa: BLE001 - a backend without the query
        return None


def allocated(device: jax.Device) -> int:
    global _peak
    stats = _stats(device)
    if stats and "bytes_in_use" in stats:
        return int(stats["bytes_in_use"])
    used = sum(a.nbytes for a in jax.live_arrays() if device in a.devices())
    _peak = max(_peak, used)
    return used


def max_allocated(device: jax.Device) -> int:
    stats = _stats(device)
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return max(_peak, allocated(device))


def reset_peak(device: jax.Device) -> None:
    global _peak
    _peak = 0
    allocated(device)


def total(device: jax.Device) -> int | None:
    """The device's memory, where the backend says (TPU, GPU); None on CPU."""
    stats = _stats(device)
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def stats(device: jax.Device) -> dict:
    """PyTorch's names for the figures it has."""
    out = {"allocated_bytes.all.current": allocated(device), "allocated_bytes.all.peak": max_allocated(device)}
    limit = total(device)
    if limit is not None:
        out["bytes_limit"] = limit
    return out
