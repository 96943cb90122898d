"""`deferfuse.mode(...)`: select the executor (Strict, Debug, DeferAndFuse) for a block of code.

Every ATen call on a tpu tensor, or one that creates a tpu tensor, reaches deferfuse's dispatcher
whether or not a block is open; the dispatcher runs it under the innermost block's executor, or
outside any block under the default one (Strict, or as TORCH_TPU_DEFER_AND_FUSE /
TORCH_TPU_LAUNCH_BLOCKING say). The executor stack is process-wide (not thread-local) because
PyTorch runs backward on its own device thread in threads that have not turned that off
(`run_backward_here`).

A block is also a `TorchDispatchMode` on PyTorch's mode stack, as this project's design names it:
tools that look at the active modes see it, and user modes pushed inside or outside it see ops
in PyTorch's usual order. Its handler sends ops on tpu tensors to deferfuse's dispatcher and
lets every other op run as it would without the block. Outside blocks (the environment's
default mode) there is no mode: tpu tensors reach deferfuse through the subclass alone.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .causes import Cause
from . import pending
from .config import CONFIG
from .executors.active import DEFAULT as _default, STACK as _stack, current  # noqa: F401  (modes.current)
from .executors.base import EagerMode, Executor
from .executors.debug import DebugExecutor
from .executors.deferred import DeferredExecutor
from .executors.strict import StrictExecutor
from .tensor import TpuTensor

EXECUTORS: dict[EagerMode, Executor] = {
    EagerMode.STRICT: StrictExecutor(),
    EagerMode.DEBUG: DebugExecutor(),
    EagerMode.DEFER_AND_FUSE: DeferredExecutor(),
}


def _env_default() -> EagerMode:
    if CONFIG.launch_blocking:
        return EagerMode.DEBUG
    if CONFIG.defer_and_fuse:
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.STRICT


_default.append(EXECUTORS[_env_default()])


def as_mode(kind: "str | EagerMode") -> EagerMode:
    try:
        return EagerMode(kind.value if isinstance(kind, EagerMode) else str(kind).lower())
    except ValueError:
        raise ValueError(
            f"unknown deferfuse mode {kind!r}; expected one of 'defer_and_fuse', 'strict', 'debug'"
        ) from None


def set_default_mode(kind: "str | EagerMode") -> None:
    """Change the mode used outside `with deferfuse.mode()` blocks; pending work is flushed first."""
    new = EXECUTORS[as_mode(kind)]
    if new is not _default[0]:
        pending.flush(Cause.MODE_CHANGE)
    _default[0] = new


def get_default_mode() -> EagerMode:
    return _default[0].kind


class DeferfuseMode(TorchDispatchMode):
    """Strict, Debug or DeferAndFuse for the code inside the block, as a TorchDispatchMode.

    The handler costs one Python call per op in the block, CPU ops included (an optimizer's
    `.item()` on its CPU step counters); docs/performance.md measures it against the same
    engine without the mode (the environment's default mode)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch would wrap the handler in torch._disable_dynamo, a Python call per op; Dynamo
        # never traces deferfuse anyway
        return False

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile inside a block compiles (Dynamo skips frames under other modes) and its
        # graphs run through the "tpu" backend, which records them under this block's executor
        return True

    def __init__(self, kind: "str | EagerMode" = EagerMode.DEFER_AND_FUSE):
        super().__init__()
        self.kind = as_mode(kind)
        self.executor = EXECUTORS[self.kind]
        self._threaded: list[bool] = []  # per nested entry of this object

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # PyTorch takes this mode off its stack while the handler runs, so what deferfuse's
        # dispatcher calls in turn goes straight to the subclass
        if TpuTensor in types:
            return TpuTensor.__torch_dispatch__(func, types, args, kwargs)
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> "DeferfuseMode":
        _stack.append(self.executor)
        # backward inside the block runs on this thread (see `run_backward_here`)
        self._threaded.append(_is_multithreading_enabled())
        _set_multithreading_enabled(False)
        return super().__enter__()

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        _set_multithreading_enabled(self._threaded.pop())
        _stack.pop()
        if exc_type is None:
            self.executor.on_exit()
        else:
            # the block raised: still run what was recorded so live tensors stay valid, but let
            # the user's exception, not a secondary flush failure, be the one they see
            try:
                pending.flush(Cause.MODE_EXIT)
            except Exception:  # noqa: BLE001 - failed storages keep the error and re-raise on use
                pass
        return False

    def __repr__(self):
        return f"deferfuse.mode({self.kind.value!r})"


_is_multithreading_enabled = torch._C._is_multithreading_enabled
_set_multithreading_enabled = torch._C._set_multithreading_enabled


def run_backward_here() -> None:
    """Make autograd run backward on the calling thread, as it does for CPU tensors.

    For any other device PyTorch hands backward to a per-device worker thread and the caller
    waits. deferfuse's ops only record or enqueue work, so that thread buys no parallelism, and
    each `backward()` pays two thread wake-ups, which are slow on busy cores (the previous step's
    program holds them). The setting is PyTorch's own thread-local
    `torch.autograd.set_multithreading_enabled(False)`: `import deferfuse` applies it to the
    importing thread and every mode block to its own thread, for the block's duration.
    """
    _set_multithreading_enabled(False)


def mode(kind: "str | EagerMode" = EagerMode.DEFER_AND_FUSE) -> DeferfuseMode:
    """`with deferfuse.mode():` runs the block in DeferAndFuse; also "strict" and "debug"."""
    return DeferfuseMode(kind)
