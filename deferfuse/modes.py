"""`deferfuse.mode(...)`: select the executor (Strict, Debug, DeferAndFuse) for a block of code.

Every ATen call on a tpu tensor, or one that creates a tpu tensor, reaches deferfuse's dispatcher
whether or not a block is open; the dispatcher runs it under the innermost block's executor, or
outside any block under the default one (Strict, or as TORCH_TPU_DEFER_AND_FUSE /
TORCH_TPU_LAUNCH_BLOCKING say). Calls on CPU tensors never enter deferfuse. The executor stack is
process-wide (not thread-local) because PyTorch runs backward on its own device thread in threads
that have not turned that off (`run_backward_here`).
"""
from __future__ import annotations

import torch

from .causes import Cause
from . import pending
from .config import CONFIG
from .executors.base import EagerMode, Executor
from .executors.debug import DebugExecutor
from .executors.deferred import DeferredExecutor
from .executors.strict import StrictExecutor

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


_default: list[Executor] = [EXECUTORS[_env_default()]]
_stack: list[Executor] = []


def current() -> Executor:
    return _stack[-1] if _stack else _default[0]


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


class DeferfuseMode:
    """Context manager selecting Strict, Debug or DeferAndFuse for the code inside it.

    It selects an executor and installs nothing in PyTorch's dispatcher: every ATen call on a tpu
    tensor already reaches deferfuse through `TpuTensor.__torch_dispatch__`, and every call that
    creates one (`device="tpu"`) through the PrivateUse1 kernels `install.py` registers. A
    TorchDispatchMode would add nothing but a Python call for every op in the block, CPU ones
    included (an optimizer's `.item()` on its CPU step counters: about 8 µs each, a hundred per
    GPT step).
    """

    def __init__(self, kind: "str | EagerMode" = EagerMode.DEFER_AND_FUSE):
        self.kind = as_mode(kind)
        self.executor = EXECUTORS[self.kind]
        self._threaded: list[bool] = []  # per nested entry of this object

    def __enter__(self) -> "DeferfuseMode":
        _stack.append(self.executor)
        # backward inside the block runs on this thread (see `run_backward_here`)
        self._threaded.append(_is_multithreading_enabled())
        _set_multithreading_enabled(False)
        return self

    def __exit__(self, exc_type, exc, tb):
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
