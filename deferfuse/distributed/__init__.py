"""torch.distributed on tpu: the "tpu_dist" backend, on JAX's multi-process runtime.

`import deferfuse` registers it as the backend for the tpu device, so under torchrun
`dist.init_process_group()` (no backend named, as "nccl" is for cuda) or
`init_process_group("tpu_dist")` gives DDP, FSDP2 and DTensor their collectives as XLA programs.
cluster.py starts JAX's runtime from the launcher's environment; docs/distributed.md says how
to launch on one host and on many.
"""
from __future__ import annotations

from .backend import BACKEND, TpuProcessGroup
from .region import spmd_safe

__all__ = ["BACKEND", "TpuProcessGroup", "spmd_safe"]
