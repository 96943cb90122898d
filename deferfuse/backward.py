"""Errors deferfuse raises while PyTorch runs backward wait until `backward()` returns.

PyTorch's autograd engine leaves each node through a stream guard whose destructor calls the
backend's device guard; for a Python backend that call happens while the Python error is still
pending, and the process aborts (std::terminate) instead of raising. Debug mode's checks (a NaN a
backward op introduced, an index out of range) therefore record their error during backward and
raise it from `backward()` / `autograd.grad()`, the user's line, once the engine has returned.
An exception a user's own backward hook raises still aborts: that one never reaches deferfuse.
"""
from __future__ import annotations

import torch

_PENDING: list = []
_graph_task_id = torch._C._current_graph_task_id


def in_backward() -> bool:
    return _graph_task_id() >= 0


def raise_or_defer(err: BaseException) -> None:
    """Raise err now, or (inside backward) once backward returns; the first error wins."""
    if not in_backward():
        raise err
    if not _PENDING:
        _PENDING.append(err)


def install() -> None:
    graph = torch.autograd.graph
    run = graph._engine_run_backward

    def _engine_run_backward(*args, **kwargs):
        try:
            return run(*args, **kwargs)
        finally:
            if _PENDING:
                err = _PENDING.pop()
                _PENDING.clear()
                raise err

    graph._engine_run_backward = _engine_run_backward
    torch.autograd._engine_run_backward = _engine_run_backward  # bound by name at its import
