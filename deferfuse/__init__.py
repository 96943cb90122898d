"""deferfuse: PyTorch eager on JAX/XLA with Strict, Debug and DeferAndFuse modes.

`import deferfuse` makes "tpu" a PyTorch device backed by JAX's default device (TPU, else GPU,
else CPU). Use `with deferfuse.mode():` (DeferAndFuse), `deferfuse.mode("strict")` or
`deferfuse.mode("debug")`, or set TORCH_TPU_DEFER_AND_FUSE / TORCH_TPU_LAUNCH_BLOCKING.
"""
from __future__ import annotations

from . import dtypes  # noqa: F401  (switches JAX to x64 before anything else touches JAX)
from . import device as _device

_device.register()

from . import persistent as _persistent  # noqa: E402
from . import interrupts as _interrupts  # noqa: E402
from .api import metrics, reset_metrics, sync  # noqa: E402
from .capture import capture  # noqa: E402
from .check import check  # noqa: E402  (the name `check` is the function; `python -m deferfuse.check` still runs)
from .config import CONFIG  # noqa: E402
from .engine import FlushError  # noqa: E402
from .executors.base import EagerMode  # noqa: E402
from .jax_op import jax_op  # noqa: E402
from .modes import DeferfuseMode, get_default_mode, mode, run_backward_here, set_default_mode  # noqa: E402
from .report import explain, report  # noqa: E402  (the name `report` is the function; the package stays importable)
from .tensor import TpuTensor  # noqa: E402

_persistent.configure()
_interrupts.ensure_installed()


def _enable_foreach_paths() -> None:
    """Let torch.optim and clip_grad_norm_ take their foreach paths for tpu tensors.

    PyTorch only picks `_foreach_*` kernels for tensors whose exact type is in a short list, and
    TpuTensor is a subclass; deferfuse records each foreach call as one node, so this is the fast
    path (one program input per list instead of one op per parameter).
    """
    import torch.optim.optimizer as _opt
    import torch.utils._foreach_utils as _fe

    for types in (_opt._foreach_supported_types, _fe._foreach_supported_types):
        if TpuTensor not in types:
            types.append(TpuTensor)


_enable_foreach_paths()
run_backward_here()

__all__ = [
    "mode",
    "EagerMode",
    "DeferfuseMode",
    "set_default_mode",
    "get_default_mode",
    "sync",
    "capture",
    "metrics",
    "reset_metrics",
    "FlushError",
    "TpuTensor",
    "CONFIG",
    "report",
    "explain",
    "check",
    "jax_op",
]
__version__ = "0.1.0"
