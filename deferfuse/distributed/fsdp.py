"""FSDP2 on tpu: freeing and re-allocating an unsharded parameter.

FSDP2 frees a gathered parameter after use by resizing its storage to zero bytes, and asks for
the bytes back before the next all-gather writes into it. A Python device backend cannot
resize a storage (PyTorch asks a C++ hook for that), so for tpu tensors "free" drops the JAX
buffer (the storage then reads as zeros until written, as a fresh allocation would) and
"allocate" has nothing to do: the all-gather's write gives the storage its new value.
"""
from __future__ import annotations

import torch

from ..pending import release
from ..target import NAME

_PATCHED = False


def patch() -> None:
    """Teach FSDP2's storage helpers about tpu tensors (once, when a tpu_dist group is made:
    importing FSDP costs more than a second, which `import deferfuse` does not pay)."""
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    from torch.distributed.fsdp._fully_shard import _fsdp_param  # noqa: PLC0415  (import cost: see above)

    theirs = _fsdp_param.free_storage

    def free_storage(tensor: torch.Tensor) -> None:
        if tensor.device.type == NAME:
            release(tensor)
        else:
            theirs(tensor)

    _fsdp_param.free_storage = free_storage
