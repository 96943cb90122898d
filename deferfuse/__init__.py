"""deferfuse: PyTorch eager on JAX/XLA with Strict, Debug and DeferAndFuse modes.

`import deferfuse` makes "tpu" a PyTorch device backed by JAX's default device (TPU, else GPU,
else CPU). Use `with deferfuse.mode():` (DeferAndFuse), `deferfuse.mode("strict")` or
`deferfuse.mode("debug")`, or set TORCH_TPU_DEFER_AND_FUSE / TORCH_TPU_LAUNCH_BLOCKING.
"""
from __future__ import annotations

from . import dtypes  # noqa: F401  (switches JAX to x64 before anything else touches JAX)
from . import install as _install

_install.register()

from . import persistent as _persistent  # noqa: E402
from . import interrupts as _interrupts  # noqa: E402
from .api import metrics, reset_metrics, sync  # noqa: E402
from .capture import capture  # noqa: E402
from . import compiler as _compiler  # noqa: E402
from .check import check  # noqa: E402  (the name `check` is the function; `python -m deferfuse.check` still runs)
from .config import CONFIG  # noqa: E402
from . import distributed  # noqa: E402,F401  (registers the "tpu_dist" torch.distributed backend)
from .pending import FlushError  # noqa: E402
from .executors.base import EagerMode  # noqa: E402
from .jax_op import jax_op  # noqa: E402
from .modes import DeferfuseMode, get_default_mode, mode, run_backward_here, set_default_mode  # noqa: E402
from .precision import precision  # noqa: E402  (the name `precision` is the function, as for `check`)
from .report import explain, report  # noqa: E402  (the name `report` is the function; the package stays importable)
from .tensor import TpuTensor  # noqa: E402

_persistent.configure()
_interrupts.install()
run_backward_here()
_compiler.install()

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
    "precision",
]
__version__ = "0.1.0"
