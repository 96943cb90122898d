"""Errors raised while PyTorch's autograd engine runs a tpu backward reach the user from
`backward()`, as on CPU, instead of aborting the process.

Why this is needed: the engine leaves each node through a stream guard whose destructor asks
the backend's device guard for its device type, and a Python backend's guard answers in Python.
If a Python exception raised inside the engine (by a tpu op a backward formula called, or by a
hook) is still pending at that moment, that call fails inside a destructor and the process
aborts (std::terminate, with no message). So no Python exception may cross into the engine's
C++ on a tpu backward.

What happens instead: the error is parked here, and the engine is stopped by a failure of its
own, in C++, with no Python error pending:
- a tpu op returns STOP, which PyTorch cannot convert to the op's result;
- a hook returns a value the engine rejects: a CPU tensor for a tpu gradient or parameter, a
  tuple of the wrong length for a node's gradients, something other than a tensor from a saved
  tensor's unpack hook.
The engine unwinds as from any error of its own (nothing after the failing op or hook runs, as
on CPU), and `backward()` / `autograd.grad()` raise the parked error in place of the engine's:
the original exception, its type and traceback intact, at the user's line.

An exception raised in Python code the engine calls (a custom Function's backward, a hook) by a
tpu op inside it is not parked: it propagates through that code as it would on CPU.

Signal handlers wait for the whole pass (interrupts.py): one that raised between two of the
engine's calls into Python would cross its C++ with nothing to park it, and on CPU an interrupt
comes once backward returns, its gradients complete. Theirs run as `_engine_run_backward` returns.
"""
from __future__ import annotations

import functools
import sys

import torch

from . import interrupts

_PENDING: list = []  # the first error of the running backward
_ENTRY = None  # the code object of PyTorch's Python entry into the engine
_ACTIVE = 0  # backward passes running through deferfuse's entry, which raises what is parked


class _Stop:
    __slots__ = ()

    def __repr__(self):
        return "<deferfuse: backward stopped by an earlier error>"


STOP = _Stop()


def _take() -> BaseException | None:
    err = _PENDING[0] if _PENDING else None
    _PENDING.clear()
    return err


def park(err: BaseException) -> None:
    """Keep err for `backward()` to raise; the first error wins."""
    if not _PENDING:
        _PENDING.append(err)


def _deferfuse_frame(f) -> bool:
    name = f.f_globals.get("__name__", "")
    return name == "deferfuse" or name.startswith("deferfuse.")


def into_engine() -> bool:
    """Whether an exception raised by deferfuse's caller would pass straight into the autograd
    engine: the nearest Python frame outside deferfuse is the engine's entry, so no Python code
    stands between the op and the engine's C++ (a backward formula or the engine called it)."""
    if not _ACTIVE:
        return False
    f = sys._getframe(1)
    while f is not None and _deferfuse_frame(f):
        f = f.f_back
    return f is not None and f.f_code is _ENTRY


def stop(err: BaseException):
    park(err)
    return STOP


def _any_tpu(args) -> bool:
    """Whether a hook's arguments (tensors, or tuples of gradients) hold a tpu tensor."""
    values = (v for a in args for v in (a if isinstance(a, tuple) else (a,)))
    return any(isinstance(v, torch.Tensor) and v.device.type == "tpu" for v in values)


_NOT_A_TPU_TENSOR = torch.empty(0)  # the engine checks what a tensor hook returns against its argument


def tensor_hook_failed(tensor):
    return _NOT_A_TPU_TENSOR


def _node_hook_failed(grads, *_):
    return (None,) * (len(grads) + 1)  # the engine checks the count first


def _unpack_failed(packed):
    return STOP  # the engine checks that an unpack hook gives a tensor


def guard_hook(hook, failed, tpu_only=False):
    """`hook`, with an exception it raises on a tpu backward parked and `failed(*args)` returned
    to the engine in its place. `tpu_only`: leave hooks of other devices' backward passes be
    (the node hooks are registered through a class PyTorch shares with CPU modules)."""

    @functools.wraps(hook)
    def guarded(*args):
        try:
            return hook(*args)
        except BaseException as err:
            if not _ACTIVE or (tpu_only and not _any_tpu(args)):
                raise
            park(err)
            return failed(*args)

    return guarded


def install() -> None:
    global _ENTRY
    graph = torch.autograd.graph
    run = graph._engine_run_backward
    _ENTRY = run.__code__

    def _engine_run_backward(*args, **kwargs):
        global _ACTIVE
        # signal handlers wait for the whole pass (interrupts.py): one that raised in Python code
        # the engine calls would cross its C++, and on CPU an interrupt comes as backward returns
        interrupts.hold()
        _ACTIVE += 1
        try:
            try:
                result = run(*args, **kwargs)
            except BaseException:
                err = _take()
                if err is None:
                    raise
                err.__suppress_context__ = True  # the engine's own error only says how it was stopped
                raise err
            err = _take()  # an op whose result the engine ignores (a void return) parked one
            if err is not None:
                raise err
            return result
        finally:
            _ACTIVE -= 1
            interrupts.release()  # the gradients are in place: the handlers of signals that came run

    graph._engine_run_backward = _engine_run_backward
    torch.autograd._engine_run_backward = _engine_run_backward  # bound by name at its import

    # nn.Module's full backward hooks (and hooks on a custom Function's node) are node hooks of
    # a Python autograd Function; hooks on built-in ops' nodes live on immutable C++ types
    node = torch.autograd.function.BackwardCFunction
    base_hook, base_prehook = node.register_hook, node.register_prehook

    def register_hook(self, fn):
        return base_hook(self, guard_hook(fn, _node_hook_failed, tpu_only=True))

    def register_prehook(self, fn):
        return base_prehook(self, guard_hook(fn, _node_hook_failed, tpu_only=True))

    node.register_hook, node.register_prehook = register_hook, register_prehook

    # saved_tensors_hooks' unpack hook runs as the engine reads a saved tensor: it is where
    # torch.utils.checkpoint (use_reentrant=False) recomputes the forward and checks it
    saved = torch.autograd.graph.saved_tensors_hooks
    base_init = saved.__init__

    def __init__(self, pack_hook, unpack_hook):
        base_init(self, pack_hook, guard_hook(unpack_hook, _unpack_failed))

    saved.__init__ = __init__
