"""Find the user's line: the first Python frame outside deferfuse, torch and the standard library.

Errors and the report name `file:line` in the user's script, never a frame inside torch. The walk
is on the recording hot path, so each code object is classified once and remembered.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import threading

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_INTERNAL_PREFIXES = tuple(
    p
    for p in {
        _PKG_DIR,
        os.path.dirname(os.path.abspath(__import__("torch").__file__)) + os.sep,
        os.path.dirname(os.path.abspath(__import__("jax").__file__)) + os.sep,
        sysconfig.get_paths()["stdlib"] + os.sep,
    }
)
# id(code) -> whether it is internal. Keyed by id because hashing a code object hashes its
# bytecode and constants (slow for a large function such as Module._call_impl, per frame per op);
# `_held` keeps every classified code object alive, so no id is reused for another.
_is_internal: dict[int, bool] = {}
_held: list = []


def _classify(code) -> bool:
    fn = code.co_filename
    hit = fn.startswith(_INTERNAL_PREFIXES) or fn.startswith("<frozen")
    _held.append(code)
    _is_internal[id(code)] = hit
    return hit


def user_frame(depth: int = 2):
    """(code object, bytecode offset) of the innermost user frame, or None (autograd's thread).

    This runs once per user-visible op, so it stores what is cheapest to read: the code object
    (long-lived, free to hold, unlike the frame and its locals) and the instruction offset. The
    line number is worked out only when a message or report needs it.
    """
    where = user_frame_of(sys._getframe(depth))
    if where is not None:
        return where
    if threading.current_thread() is not _MAIN:
        # PyTorch runs backward on its own thread while the main thread waits inside
        # `loss.backward()`: attribute the op to that line, found once per backward call (the
        # main thread cannot move until it returns; reading its stack per op costs more than
        # recording the op)
        task = _graph_task_id()
        cached = _TASK[0]  # one read: another thread's backward may replace it meanwhile
        if task >= 0 and cached[0] == task:
            return cached[1]
        main = sys._current_frames().get(_MAIN.ident)
        where = (user_frame_of(main) or _AUTOGRAD) if main is not None else _AUTOGRAD
        if task >= 0:
            _TASK[0] = (task, where)
        return where
    return None


_graph_task_id = __import__("torch")._C._current_graph_task_id
_TASK: list = [(-1, None)]  # (graph task id, the main thread's user line during it)


def user_frame_of(f):
    get = _is_internal.get
    while f is not None:
        code = f.f_code
        hit = get(id(code))
        if hit is None:
            hit = _classify(code)
        if not hit:
            return (code, f.f_lasti)
        f = f.f_back
    return None


_MAIN = threading.main_thread()
_AUTOGRAD = ("<autograd>", 0)


def _line(code, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def parts(where) -> tuple[str, int, str]:
    """(filename, line, function) of a recorded location."""
    if where is None:
        return ("<unknown>", 0, "")
    a, pos = where[0], where[1]
    if isinstance(a, str):
        return (a, pos, where[2] if len(where) > 2 else "")
    return (a.co_filename, _line(a, pos), a.co_name)


def fmt(where) -> str:
    if where is None:
        return "<unknown>"
    filename, line, _ = parts(where)
    return f"{filename}:{line}" if line else filename
