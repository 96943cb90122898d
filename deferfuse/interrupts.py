"""No signal handler's exception cuts an op, a flush or a backward pass, nor aborts the process.

Python runs a signal handler in the main thread at the next bytecode boundary, or wherever C
code checks for signals, and an exception it raises (Ctrl-C's KeyboardInterrupt, a SIGALRM
timeout's, a SIGTERM handler's SystemExit) propagates from there. Three places must not see one:

- deferfuse's own code while it records an op: a foreach op would be left half applied, or the
  pending graph inconsistent (a reused program then reads shifted scalars: a wrong value);
- a flush, or a replay of a compiled graph or a captured step: once a program has consumed
  donated inputs, its outputs are the only copy, and an exception before they are bound loses them;
- PyTorch's C++ calling the device guard (autograd asks it for the tpu's stream as each op records
  its history, and the engine as it leaves each backward node): the guard is Python, and PyTorch
  reaches it through pybind11, which converts a name with `PyObject_Str`, which runs pending
  signal handlers. The guard's methods are `noexcept`: an exception there is std::terminate
  ("terminate called without an active exception"), whatever the handler.

So every Python-level handler of the process is replaced, once, by a `StandIn` that calls it
unless one of those is under way. The stand-in is installed by `signal.signal` itself (patched
here: installing a handler wraps it, and `signal.getsignal` answers the handler itself, so code
that compares what it installed, unittest's Ctrl-C handling among them, sees no difference), and
at import and as each flush begins for a handler installed around the patch (`_signal.signal`).
Because it stays installed, recording an op costs nothing more: the stand-in reads, only when a
signal arrives, the state deferfuse keeps anyway (`call.in_op`, the flush flag, `hold`'s depth).
Swapping the handlers around each op instead cost 1.5 µs an op, against 8 to 14 to record one.

While deferfuse is busy the handler's call is noted, and it runs when the op, flush, replay or
backward pass ends (`deliver`, from `release` and the end of each op): its exception propagates
from there, with everything in place. Inside the device guard it cannot be noted for later (no
later point is certain to come), so the signal is raised again as the handler returns (`_again`)
and handled at the next check, outside the guard. The guard counts its calls in C
(`guard_attribute`): a lookup of its method not yet followed by a call means the handler runs
inside one.

A backward pass is held whole, from `_engine_run_backward`: the engine calls Python (ops, hooks) in
C++ that an exception crossing it can abort, and on CPU an interrupt arrives once backward
returns, its gradients all in place. The hold applies to CPU backward passes too: a hook that never
returns cannot be interrupted by a handler, as a C++ one cannot on CPU.

Busy is the main thread's state: the flags are process-wide, so a handler also checks that the
interrupted stack is in deferfuse (a thread that records while the main thread waits in `join()`
does not keep Ctrl-C from it). Handlers run in the main thread, and so do held ones.

Blocking the signals (`signal.pthread_sigmask`) would not do: it masks the main thread only,
another thread takes a process-directed signal, and Python still runs its handler in the main
thread. Other exceptions that can land anywhere (SystemExit from a hook, MemoryError) are
handled where they land: a flush that had not consumed an input leaves its work pending, and
otherwise raises on reading what it did not finish (pending.py).
"""
from __future__ import annotations

import _signal  # signal.getsignal makes an enum of each answer: 40 µs for every signal, this 1.5
import _thread
import functools
import itertools
import signal
import threading
import weakref
from typing import Callable

_busy: list[Callable[[], bool]] = []  # each says whether deferfuse's code is running (any thread)
_held = False  # a handler's call waits in `_deferred` (read per op: dispatch.py)
_depth = 0  # `hold` ... `release` nesting, main thread only
_deferred: dict[int, tuple] = {}  # signal -> (handler, signal, frame), in order of arrival
_MAIN_ID = threading.main_thread().ident
_get_ident = threading.get_ident
_SIGNALS = tuple(sorted(signal.valid_signals()))
_getsignal = _signal.getsignal
_setsignal = _signal.signal
_interrupt_main = _thread.interrupt_main
_scan: list = [None]  # every signal's handler as last wrapped
_echoes: list = []  # `_again`'s weak references, alive until their callback runs

_N = 1 << 62  # a count that never runs out: a billion guard calls a second last 146 years
_guard: list = []  # the device guard's two countdowns: lookups of its method, calls of it
_guard_seen = [0, None]  # lookups never called (Python code's own), counts at the last re-raise


class StandIn:
    """What is installed in place of a Python signal handler: calls it, or has it wait."""

    __slots__ = ("handler", "__weakref__")

    def __init__(self, handler: Callable):
        self.handler = handler

    @property
    def __wrapped__(self) -> Callable:
        return self.handler

    def __repr__(self):
        return f"<deferfuse stand-in for {self.handler!r}>"

    def __call__(self, signum, frame):
        global _held
        if _depth or (any(check() for check in _busy) and _inside(frame)):
            _deferred.setdefault(signum, (self.handler, signum, frame))  # repeats coalesce, as Python's do
            _held = True
            return None
        if _in_guard():
            return _again(signum)
        return self.handler(signum, frame)


class _Again:
    __slots__ = ("__weakref__",)


def _again(signum: int) -> _Again:
    """Raise the signal again once this stand-in has returned, from C: Python checks for signals
    after every call, so raising it from the stand-in's own code would have it handled there, still
    inside the guard. What the stand-in returns is released by C as it returns, and the release
    calls C callables only (`interrupt_main` over a one-item map, which `dict.fromkeys` consumes)."""
    token = _Again()
    _echoes[:] = [r for r in _echoes if r() is not None]
    _echoes.append(weakref.ref(token, functools.partial(dict.fromkeys, map(_interrupt_main, (signum,)))))
    return token


def when_busy(check: Callable[[], bool]) -> None:
    """Register a check that deferfuse is inside an op or a flush (dispatch.py, pending.py fill it)."""
    _busy.append(check)


def _inside(frame) -> bool:
    """Whether the interrupted stack (the main thread's) runs deferfuse's code."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == "deferfuse" or name.startswith("deferfuse."):
            return True
        frame = frame.f_back
    return False


def _is_busy() -> bool:
    return _depth > 0 or any(check() for check in _busy)


def held() -> bool:
    return _held


def deliver() -> None:
    """Run the handlers of signals that came while deferfuse was busy, once it no longer is; the
    first exception one raises propagates from here (when several raise, the last, with the
    earlier as its context, as Python's own delivery would)."""
    global _held
    if not _held or _get_ident() != _MAIN_ID or _is_busy():
        return
    _held = False
    waiting = list(_deferred.values())
    _deferred.clear()
    _run(waiting)


def _run(waiting: list) -> None:
    while waiting:
        handler, signum, frame = waiting.pop(0)
        try:
            handler(signum, frame)
        finally:
            _run(waiting)


def hold() -> None:
    """From here until `release`, no Python signal handler runs: each that is called for waits.
    Called before a flush, replay or backward pass changes anything, so that a handler which
    raises as it is called leaves nothing to undo. A scan of every signal's handler (1.5 µs)
    wraps one installed around `signal.signal`."""
    global _depth
    if _get_ident() != _MAIN_ID:  # handlers run in the main thread only: nothing to hold here
        return
    _depth += 1
    if list(map(_getsignal, _SIGNALS)) != _scan[0]:
        try:
            ensure_installed()  # a handler of a signal already pending may run (and raise) here
        except BaseException:
            _depth -= 1
            raise


def release() -> None:
    """End `hold`; at the outermost, run the handlers that were called for. Called once the
    results are in their storages."""
    global _depth
    if _get_ident() != _MAIN_ID or not _depth:
        return
    _depth -= 1
    if not _depth and _held:
        deliver()


def ensure_installed() -> None:
    """Put a stand-in in front of every Python-level handler (from the main thread)."""
    if _get_ident() != _MAIN_ID:
        return
    for s in _SIGNALS:
        h = _getsignal(s)
        if callable(h) and not isinstance(h, StandIn):
            _setsignal(s, StandIn(h))
    _scan[0] = list(map(_getsignal, _SIGNALS))


def _unwrap(handler):
    return handler.handler if isinstance(handler, StandIn) else handler


_signal_signal = signal.signal
_signal_getsignal = signal.getsignal


@functools.wraps(_signal_signal)
def _install_handler(signalnum, handler):
    if callable(handler) and not isinstance(handler, StandIn):
        handler = StandIn(handler)
    return _unwrap(_signal_signal(signalnum, handler))


@functools.wraps(_signal_getsignal)
def _installed_handler(signalnum):
    return _unwrap(_signal_getsignal(signalnum))


def install() -> None:
    """Have `signal.signal` install stand-ins, and wrap the handlers already installed."""
    signal.signal, signal.getsignal = _install_handler, _installed_handler
    ensure_installed()


def guard_attribute(value) -> property:
    """The device guard's `type_`: a property whose getter and result are C callables, so that
    no Python code runs inside the guard (a handler would run at its first line) and each lookup
    and each call is counted in C, for `_in_guard`. pybind11 looks the method up, runs pending
    handlers (`PyObject_Str`), then calls it: between the two, the lookups are one ahead."""
    calls = itertools.repeat(value, _N)
    lookups = itertools.repeat(calls.__next__, _N)
    _guard[:] = lookups, calls
    return property(functools.partial(next, lookups))


def _in_guard() -> bool:
    """Whether this handler runs inside a call of the device guard (see `guard_attribute`)."""
    if not _guard:
        return False
    counts = (_N - _guard[0].__length_hint__(), _N - _guard[1].__length_hint__())
    ahead = counts[0] - counts[1] - _guard_seen[0]
    if not ahead:
        return False
    if counts == _guard_seen[1]:  # no guard call since the last re-raise: a lookup by Python code
        _guard_seen[0] += ahead
        return False
    _guard_seen[1] = counts
    return True
