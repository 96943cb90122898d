"""Ctrl-C never cuts an op or a flush in half.

A KeyboardInterrupt that lands while deferfuse records an op or runs a flush could leave a
storage detached from its pending graph with no value yet (it then read as zeros), or an op half
recorded. Python raises it from its SIGINT handler at the next bytecode boundary, wherever that
is. So while deferfuse's own code runs, deferfuse's handler holds the interrupt, and raises it the
moment that code is done: after the op (which then happened completely) or after the flush (whose
values are then all in place). Between ops, in the user's code, it raises at once, exactly as
Python's own handler does.

The handler replaces only Python's default one (`signal.default_int_handler`), in the main thread;
a handler of the user's own is left alone. Jupyter's kernel puts the default back for every cell,
so each flush puts deferfuse's back (`ensure_installed`, a dictionary lookup when nothing changed).

Other exceptions that can land anywhere (one raised by the user's own signal handler, SystemExit
from a hook) are handled where they land: a flush that had not consumed an input leaves its work
pending, and otherwise raises on reading what it did not finish (pending.py).
"""
from __future__ import annotations

import signal
import threading
from typing import Callable

_busy: list[Callable[[], bool]] = []  # each says whether deferfuse's code is running
_held = False  # an interrupt arrived while it was
_MAIN = threading.main_thread()


def when_busy(check: Callable[[], bool]) -> None:
    """Register a check that deferfuse is inside an op or a flush (dispatch.py, pending.py fill it)."""
    _busy.append(check)


def _handler(signum, frame):
    global _held
    if any(check() for check in _busy):
        _held = True
        return
    raise KeyboardInterrupt


def ensure_installed() -> None:
    """Put deferfuse's SIGINT handler in place of Python's default one, from the main thread."""
    if threading.current_thread() is _MAIN and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)


def deliver() -> None:
    """Raise an interrupt that arrived while deferfuse was busy, once it no longer is."""
    global _held
    if _held and not any(check() for check in _busy):
        _held = False
        raise KeyboardInterrupt


def held() -> bool:
    return _held
