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
_is_internal: dict = {}


def _internal(code) -> bool:
    hit = _is_internal.get(code)
    if hit is None:
        fn = code.co_filename
        hit = fn.startswith(_INTERNAL_PREFIXES) or fn.startswith("<frozen")
        _is_internal[code] = hit
    return hit


def user_frame(depth: int = 2) -> tuple[str, int, str] | None:
    """(filename, lineno, function) of the innermost user frame, or None (e.g. autograd thread)."""
    f = sys._getframe(depth)
    while f is not None:
        code = f.f_code
        if not _internal(code):
            return (code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    if threading.current_thread() is not threading.main_thread():
        return ("<autograd>", 0, "backward")
    return None


def fmt(where: tuple[str, int, str] | None) -> str:
    if where is None:
        return "<unknown>"
    return f"{where[0]}:{where[1]}"
