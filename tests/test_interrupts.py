"""Interrupts (Ctrl-C, an exception from a signal handler or a hook) never lose data: every op
recorded before one stays, every live tensor reads back, and the interrupted op happened
completely or not at all (deferfuse/interrupts.py, pending.flush). A signal handler of the user's
own (not deferfuse's SIGINT one) waits through a flush or a replay, since a program that consumed
donated inputs cannot be undone."""
from __future__ import annotations

import _signal
import os
import signal
import subprocess
import sys

import pytest
import torch

import deferfuse
from deferfuse import cache, install, interrupts, record
from deferfuse.cache import runtime
from deferfuse.config import CONFIG
from deferfuse.record import CALL
from conftest import MODES, ROOT, child_env


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", MODES)
def test_sigint_at_random_moments_of_a_recording_and_flushing_loop(mode, tmp_path):
    """A thread sends SIGINT at random moments of a loop of in-place ops, ops through a view, a
    foreach op over two tensors and host reads, about a hundred times in DeferAndFuse and over a
    thousand in Strict; after each, the loop checks every value against its count of completed
    ops. Before interrupts.py, a flush cut by one left its tensors reading zeros. A fresh
    persistent cache folder, so interrupts also land while its entries are read and written
    (JAX's own store deadlocked there)."""
    out = _run_script("interrupt_loop.py", mode, "8", "1", "20", DEFERFUSE_CACHE_DIR=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    caught = int(out.stdout.split()[1])
    assert caught >= 20, out.stdout


def _pending_work():
    x = torch.ones(4, device="tpu")
    deferfuse.sync()  # x is concrete: its old value is the flush's input, which x.add_ replaces
    y = x * 2
    x.add_(1)
    return x, y


def test_an_interrupt_before_the_programs_ran_leaves_the_work_pending(monkeypatch):
    real = cache.execute

    def interrupted(*args):
        monkeypatch.setattr(cache, "execute", real)
        raise KeyboardInterrupt

    with deferfuse.mode():
        x, y = _pending_work()
        pending = deferfuse.metrics()["pending_nodes"]
        monkeypatch.setattr(cache, "execute", interrupted)
        with pytest.raises(KeyboardInterrupt):
            y.cpu()
        assert deferfuse.metrics()["pending_nodes"] == pending
        assert y.cpu().tolist() == [2.0] * 4 and x.cpu().tolist() == [2.0] * 4


def test_an_interrupt_as_a_flush_begins_leaves_the_work_pending(monkeypatch):
    """A signal handler raises as the flush's hold begins (a handler installed around
    `signal.signal`, for a signal already pending): the flush used to take the graph still
    pending for a new one, and its values for lost."""
    def interrupted():
        monkeypatch.undo()
        raise KeyboardInterrupt

    with deferfuse.mode():
        x, y = _pending_work()
        pending = deferfuse.metrics()["pending_nodes"]
        monkeypatch.setattr(interrupts, "hold", interrupted)
        with pytest.raises(KeyboardInterrupt):
            y.cpu()
        assert deferfuse.metrics()["pending_nodes"] == pending
        assert y.cpu().tolist() == [2.0] * 4 and x.cpu().tolist() == [2.0] * 4


def test_an_interrupt_after_the_programs_consumed_their_inputs_raises_on_read(monkeypatch):
    """x's old value is donated to its new one: once the program has run, the flush cannot be
    undone, and what it was to produce raises the interrupt, named, instead of reading zeros."""
    real = cache.execute

    def ran_then_interrupted(g, *args):
        real(g, *args)
        assert any(a.is_deleted() for a in g.inputs)  # the donation this test is about
        raise KeyboardInterrupt

    with deferfuse.mode():
        x, y = _pending_work()
        monkeypatch.setattr(cache, "execute", ran_then_interrupted)
        with pytest.raises(KeyboardInterrupt):
            y.cpu()
    monkeypatch.setattr(cache, "execute", real)
    for t in (x, y):
        with pytest.raises(deferfuse.FlushError, match="interrupted by KeyboardInterrupt"):
            t.cpu()


def test_an_interrupt_held_during_a_flush_is_raised_when_it_ends(monkeypatch):
    real = cache.execute

    def signalled(*args):
        signal.raise_signal(signal.SIGINT)  # this thread, so handled now, inside the flush: held
        return real(*args)

    with deferfuse.mode():
        x, y = _pending_work()
        monkeypatch.setattr(cache, "execute", signalled)
        with pytest.raises(KeyboardInterrupt):
            deferfuse.sync()
    monkeypatch.setattr(cache, "execute", real)
    assert y.cpu().tolist() == [2.0] * 4 and x.cpu().tolist() == [2.0] * 4  # the flush completed


@pytest.mark.parametrize("mode", MODES)
def test_an_interrupt_as_an_op_is_first_seen_leaves_it_routable(mode, monkeypatch):
    """A SIGINT while an overload's first call chose its route (before the op's hold begins) left
    the overload without one for the rest of the process: every later call raised "'NoneType'
    object is not callable". The SIGINT loop above found it in Debug."""
    x, y = torch.tensor([3.0, 5.0]), torch.tensor([4.0, 12.0])
    a, b = x.to("tpu"), y.to("tpu")
    op = torch.ops.aten.hypot.default
    monkeypatch.delattr(op, "_df", raising=False)  # first seen from here on
    real = record.ROUTER.classify

    def interrupted(info, func):
        monkeypatch.setattr(record.ROUTER, "classify", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(record.ROUTER, "classify", interrupted)
    with deferfuse.mode(mode):
        with pytest.raises(KeyboardInterrupt):
            torch.hypot(a, b)
        torch.testing.assert_close(torch.hypot(a, b).cpu(), torch.hypot(x, y))


def test_signal_signal_installs_a_stand_in_that_getsignal_does_not_show():
    """Code that compares the handler it installed with `signal.getsignal` (unittest's Ctrl-C
    handling does, to chain handlers) sees its own function; the stand-in is what runs."""
    def mine(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, mine)
    try:
        assert signal.getsignal(signal.SIGINT) is mine
        assert isinstance(_signal.getsignal(signal.SIGINT), interrupts.StandIn)
        assert signal.signal(signal.SIGINT, signal.default_int_handler) is mine
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        _signal.signal(signal.SIGINT, mine)  # around the patch: wrapped as the next flush begins
        interrupts.hold()
        interrupts.release()
        assert _signal.getsignal(signal.SIGINT).handler is mine
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["defer_and_fuse", "strict", "split"])
def test_a_signal_handlers_exception_in_a_flush_loses_nothing(mode):
    """A SIGALRM handler of the user's own raises KeyboardInterrupt for a signal that arrives
    while a flush runs, in 200 trials of a training-like loop that donates its parameters' buffers
    every step (`split`: DeferAndFuse with programs of two ops, so also between the programs of
    one flush). Before the hold (interrupts.py), a value was lost, raising FlushError when read,
    in 61, 84 and 43 of the 200 trials."""
    args = ["defer_and_fuse", "200", "1", "split"] if mode == "split" else [mode, "200", "1"]
    out = _run_script("alarm_loop.py", *args)
    lost = [line for line in out.stderr.splitlines() if line.startswith("trial ")]
    assert out.returncode == 0, (out.stdout, lost[:5] or out.stderr[-2000:])
    assert out.stdout.split()[:2] == ["interrupts", "200"], out.stdout


def _run_script(name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "tests", name), *args], capture_output=True, text=True,
                          timeout=240, env=child_env(**env))


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["defer_and_fuse", "strict"])
def test_a_signal_handlers_exception_anywhere_loses_nothing(mode):
    """The SIGALRM handler raises wherever the signal lands, 200 times: recording an op, autograd
    asking the device guard, backward, SGD's step, a view write, a foreach op, a flush. Before
    interrupts.py's stand-ins the process aborted within seconds (exit 134, in autograd); without
    backward passes, a foreach op was left half applied, a view write landed shifted (silently
    wrong) and a storage read back as an object array, in 8 of 600 DeferAndFuse trials."""
    out = _run_script("alarm_loop.py", mode, "200", "1", "anywhere")
    bad = [line for line in out.stderr.splitlines() if line.startswith("trial ")]
    assert out.returncode == 0, (out.stdout, bad[:5] or out.stderr[-2000:])
    assert out.stdout.split()[:2] == ["interrupts", "200"], out.stdout


@pytest.mark.subprocess
@pytest.mark.parametrize("mode", ["defer_and_fuse", "strict"])
def test_ctrl_c_in_forward_and_backward_never_aborts(mode):
    """SIGINT from another thread at random moments of forward and backward passes, 200 times,
    with Python's own handler and with the user's: it used to abort the process within a few
    trials. Each interrupt that came through backward() came after it returned, its gradients
    complete (as on CPU); about half of them do."""
    out = _run_script("sigint_grad_loop.py", mode, "200", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    words = out.stdout.split()
    assert words[:2] == ["interrupts", "200"] and int(words[3]) >= 20, out.stdout


def test_a_lookup_of_the_guards_method_by_python_code_keeps_no_signal_waiting():
    """A lookup never called looks like a guard call under way: the first signal after it is
    raised again, the next runs its handler."""
    ran = []

    def mine(signum, frame):
        ran.append(signum)
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGUSR1, mine)
    try:
        for _ in range(3):
            assert isinstance(install._Guard().type_, object)
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGUSR1)
                for _ in range(3):  # checks for signals: the signal raised again is handled here
                    pass
        assert ran == [signal.SIGUSR1] * 3
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_another_threads_op_does_not_hold_the_main_threads_handlers(monkeypatch):
    """The busy flags are process-wide; a Ctrl-C for a main thread that waits while a thread
    records must still run (it would wait for the main thread's next op)."""
    monkeypatch.setattr(CALL, "in_op", 1)
    ran = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: ran.append(signum))
    try:
        signal.raise_signal(signal.SIGUSR1)
        assert ran == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, before)


@pytest.fixture
def alarm():
    """A SIGALRM handler that raises KeyboardInterrupt, as a user's timeout would."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, handler)
    yield handler
    signal.signal(signal.SIGALRM, before)


def _signal_after_first_donating_run(monkeypatch):
    """The signal arrives as the first program that runs donating returns: the moment its inputs
    are consumed and its outputs are not yet anywhere (pending.flush, compiled graph replays)."""
    real = runtime.Compiled.run
    calls = []

    def run(self, inputs, scalars, replaces=None):
        out = real(self, inputs, scalars, replaces)
        calls.append([a.is_deleted() for a in inputs])
        if len(calls) == 1:
            signal.raise_signal(signal.SIGALRM)
        return out

    monkeypatch.setattr(runtime.Compiled, "run", run)
    return calls


def test_a_signal_between_two_programs_of_a_flush_loses_nothing(monkeypatch, alarm):
    monkeypatch.setattr(CONFIG, "max_group_ops", 1)  # each op its own program
    x = torch.ones(4, device="tpu")
    deferfuse.sync()
    calls = _signal_after_first_donating_run(monkeypatch)
    with deferfuse.mode():
        x.add_(1)
        y = x * 3
        x.mul_(2)
        with pytest.raises(KeyboardInterrupt):
            deferfuse.sync()
    assert x.cpu().tolist() == [4.0] * 4 and y.cpu().tolist() == [6.0] * 4
    assert len(calls) == 3 and any(calls[0])  # the first of three programs consumed x's old value


def test_a_signal_as_a_compiled_graph_replays_loses_nothing(monkeypatch, alarm):
    """Strict runs each call of a compiled graph at once, donating the argument it updates."""
    def step(p, g):
        p.add_(g)
        return p * 2

    compiled = torch.compile(step, backend="tpu")
    p, g = torch.zeros(8, device="tpu"), torch.ones(8, device="tpu")
    with deferfuse.mode("strict"):
        compiled(p, g)  # records
        compiled(p, g)  # replays once, compiling the donating variant
        calls = _signal_after_first_donating_run(monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            compiled(p, g)
    assert calls and any(calls[0])
    assert p.cpu().tolist() == [3.0] * 8


def test_a_signal_as_a_captured_step_replays_loses_nothing(monkeypatch, alarm):
    p = torch.zeros(8, device="tpu")
    deferfuse.sync()
    captured = deferfuse.capture(lambda: p.add_(1))
    captured()
    calls = _signal_after_first_donating_run(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        captured()
    assert calls and any(calls[0])
    assert p.cpu().tolist() == [3.0] * 8


def test_hold_defers_every_handler_until_release():
    ran = []

    def mine(signum, frame):
        ran.append(signum)
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGUSR1, mine)
    before_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupts.hold()
        try:
            signal.raise_signal(signal.SIGUSR1)
            signal.raise_signal(signal.SIGINT)  # Python's own Ctrl-C handler waits too
            assert ran == [] and interrupts.held()
        finally:
            with pytest.raises(KeyboardInterrupt) as caught:
                interrupts.release()
        assert ran == [signal.SIGUSR1] and signal.getsignal(signal.SIGUSR1) is mine
        assert isinstance(caught.value.__context__, KeyboardInterrupt)  # both ran: the second raised last
        assert not interrupts.held()
    finally:
        signal.signal(signal.SIGUSR1, before)
        signal.signal(signal.SIGINT, before_int)
