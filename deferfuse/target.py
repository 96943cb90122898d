"""The device deferfuse serves: its PyTorch name, the JAX device behind it, and how an index or
a `torch.device` names it. A leaf every layer may import; the wiring into PyTorch is install.py."""
from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading

import jax
import torch

from . import cluster

NAME = "tpu"

# PyTorch knows the name from here on, so torch.device("tpu") works in every module that imports
# this one; install.py wires in the rest (hooks, guard, kernels, the torch.tpu module).
if torch._C._get_privateuse1_backend_name() != NAME:
    torch.utils.rename_privateuse1_backend(NAME)


# Modules PyTorch imports on the way to a process's first op on a new device, seconds of Python
# each: `Tensor.to` imports DTensor from C++, and the first Python meta kernel (`aten.add`'s) runs
# under `_disable_dynamo`, which imports Dynamo and, through symbolic shapes, sympy.
_FIRST_OP_IMPORTS = ("torch.distributed.tensor", "torch._dynamo")
# Should an import still wait on a lock the caller holds (one that `_importing` does not see), the
# device goes on without it after this long, and the thread finishes once the lock is let go.
_IMPORT_WAIT_S = 30.0


@functools.cache
def jax_device() -> jax.Device:
    """This process's device: a TPU where there is one, else GPU, else CPU. The first call starts
    the multi-process runtime when the launcher asked for one (cluster.py); then the device is
    this process's own (`jax.devices()[0]` is process 0's).

    Opening a TPU takes seconds in the runtime's C++, and the first op would then spend seconds
    more importing PyTorch's lazy modules: a thread imports them while the device opens. The
    call waits for both, so no import runs beside the user's code. It imports nothing early when
    the device opens from inside an import (a module that makes a tensor as it loads): that
    import holds a lock the thread's imports could wait on, while this call waits on the thread."""
    names = [] if _importing() else [n for n in _FIRST_OP_IMPORTS if n not in sys.modules]
    with _importing_beside(names):
        cluster.start()
        return jax.local_devices()[0]


def opened() -> bool:
    """Whether this process has opened its device. A sync before then has nothing to wait for, and
    leaves it closed: on a TPU host one process holds the chip, and a parent that only syncs (a
    test runner's cleanup, a launcher) would take it from the processes it starts."""
    return jax_device.cache_info().currsize > 0


def _importing() -> bool:
    return any(getattr(getattr(m, "__spec__", None), "_initializing", False) for m in list(sys.modules.values()))


@contextlib.contextmanager
def _importing_beside(names: list[str]):
    if not names:
        yield
        return
    early = threading.Thread(target=_import_all, args=(names,), name="deferfuse-imports", daemon=True)
    early.start()
    try:
        yield
    finally:
        early.join(_IMPORT_WAIT_S)


def _import_all(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  (the first op imports it again, and raises where the user sees it)
            continue


def jit(fn, **kwargs):
    """`jax.jit` for a program of this device: its outputs committed to it, whatever its inputs.

    JAX keys a jitted function's compiled programs by whether each argument is committed to a
    device, and a program none of whose inputs is committed (a factory's, `torch.zeros` flushed
    alone; fills whose inputs only give a shape, which XLA prunes) returns uncommitted arrays.
    The next program reading one compiles again once the same place holds a committed value
    (the first training step's optimizer state against the second step's, a KV cache made
    apart against the cache a decode step wrote): a recompile every later call avoids, which
    deferfuse's own cache never sees, seconds each on a TPU."""
    return jax.jit(fn, out_shardings=jax.sharding.SingleDeviceSharding(jax_device()), **kwargs)


def platform() -> str:
    """The JAX platform behind the device ("tpu", "gpu", "cpu"): what decides which dtypes and ops
    its XLA lacks (device_dtypes.py, lowering/device_limits.py)."""
    return jax_device().platform


def device_index(device) -> int:
    """The index `device` names, read as torch.cuda reads one (its _get_device_index): None and
    "tpu" name the current device, 0; a device of another type is its ValueError."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != NAME:
            raise ValueError(f"Expected a {NAME} device, but got: {device}")
        device = device.index
    return 0 if device is None else device


def check_ordinal(device) -> None:
    """torch.cuda.device and synchronize take a negative index as "no change" and fail on one past
    the last device when they select it ("CUDA error: invalid device ordinal")."""
    if device_index(device) not in (-1, 0):
        raise torch.AcceleratorError(f"deferfuse: invalid device ordinal: there is one tpu device (tpu:0), "
                                     f"got {device}")
