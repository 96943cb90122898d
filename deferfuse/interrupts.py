"""Ctrl-C never cuts an op or a flush in half, nor does any other signal handler's exception a flush.

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

Once a program has consumed donated inputs, an exception from *any* handler (a SIGALRM timeout,
a SIGTERM or SIGCHLD handler, a SIGINT handler of the user's own) would lose what it computed: its
inputs are gone and its outputs are not yet in their storages. So through every flush, and every
replay of a compiled graph or a captured step, from before it changes anything until its results
are bound (`hold` ... `release`), each Python-level handler of the process is swapped for `_defer`,
which notes the signal; `release` puts the handlers back and then runs each noted one, whose
exception propagates from there, with nothing lost. The hold starts before anything changes rather
than at the first donation: an exception that landed earlier would need the flush undone, and the
undoing could itself be cut by the next one. Blocking the signals (`signal.pthread_sigmask`) would
not do: it masks the main thread only, another thread takes a process-directed signal, and Python
still runs its handler in the main thread. Python runs handlers only in the main thread, so a flush
on another thread needs no hold. An op being recorded is not held for other handlers than
deferfuse's own SIGINT one: a scan of the handlers per op would cost a fifth of recording one.

Other exceptions that can land anywhere (SystemExit from a hook, MemoryError) are handled where
they land: a flush that had not consumed an input leaves its work pending, and otherwise raises on
reading what it did not finish (pending.py).
"""
from __future__ import annotations

import _signal  # signal.getsignal makes an enum of each answer: 40 µs for every signal, this 1.5
import signal
import threading
from typing import Callable

_busy: list[Callable[[], bool]] = []  # each says whether deferfuse's code is running
_held = False  # an interrupt arrived while it was
_MAIN = threading.main_thread()
_MAIN_ID = _MAIN.ident
_get_ident = threading.get_ident
_SIGNALS = tuple(sorted(signal.valid_signals()))
_getsignal = _signal.getsignal
_setsignal = _signal.signal

_holding = False  # between `hold` and `release`
_originals: dict[int, Callable] = {}  # signal -> the handler `_defer` stands in for
_deferred: list[tuple] = []  # (handler, signal, frame) of each signal that arrived while holding
_scan: list = [None, ()]  # the last scan's answers, and the positions among them of handlers to swap


def when_busy(check: Callable[[], bool]) -> None:
    """Register a check that deferfuse is inside an op or a flush (dispatch.py, pending.py fill it)."""
    _busy.append(check)


def _is_busy() -> bool:
    return _holding or any(check() for check in _busy)


def _handler(signum, frame):
    global _held
    if _is_busy():
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
    if _held and not _is_busy():
        _held = False
        raise KeyboardInterrupt


def held() -> bool:
    return _held


def _defer(signum, frame):
    """Stands in for a handler while holding; between a `release` cut short and the next one, it
    passes the signal on."""
    handler = _originals[signum]
    if _holding:
        _deferred.append((handler, signum, frame))
        return None
    return handler(signum, frame)


def hold() -> None:
    """From here until `release`, no Python signal handler runs: each that is called for is noted.
    Called before a flush or replay changes anything, so that a handler which raises here, for a
    signal already pending, leaves nothing to undo. A scan of every signal's handler (1.5 µs) and,
    only where a handler of the user's own is installed, a swap of each."""
    global _holding
    if _holding or _get_ident() != _MAIN_ID:
        return
    _holding = True  # deferfuse's SIGINT handler holds from here, and `_defer` notes
    found = list(map(_getsignal, _SIGNALS))
    if found != _scan[0]:
        _scan[:] = found, [i for i, h in enumerate(found) if h is not _handler and h is not _defer and callable(h)]
    for i in _scan[1]:
        s = _SIGNALS[i]
        _originals[s] = found[i]
        _setsignal(s, _defer)  # runs the handlers of signals already pending first


def release() -> None:
    """End `hold`: put the handlers back, then run those that were called for, in order; an
    exception one raises propagates from here (when several raise, the last, with the earlier as
    its context, as Python's own delivery would). Called once the results are in their storages."""
    global _holding
    if not _holding or _get_ident() != _MAIN_ID:
        return
    _holding = False  # from here `_defer` passes signals on, should putting back be cut short
    if _originals or _deferred:
        try:
            _put_back()
        finally:
            _run_deferred()
    if _held:
        deliver()


def _run_deferred() -> None:
    while _deferred:
        handler, signum, frame = _deferred.pop(0)
        try:
            handler(signum, frame)
        finally:
            _run_deferred()


def _put_back() -> None:
    for s in list(_originals):
        if _getsignal(s) is _defer:  # else the user installed a handler since (after a cut-short release)
            _setsignal(s, _originals[s])
        del _originals[s]
