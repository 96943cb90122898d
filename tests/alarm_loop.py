"""A training-like loop (SGD on two parameters, a write through a view, a foreach op, each updated
in place so that every flush donates their old buffers) interrupted by a KeyboardInterrupt that a
SIGALRM handler of the user's own raises: deferfuse's own SIGINT handling does not see it. After
each interrupt every tensor must read back (never a FlushError, never zeros) and every op must have
happened completely or not at all: a backward pass leaves both gradients or neither, the foreach
op both of its tensors, SGD's one foreach op both parameters.

By default the handler raises only for a signal that arrives while a flush runs (the timer fires
every few hundred microseconds; anywhere else it lets the loop go on), so each trial ends in a
flush, the window where a program may already have consumed its inputs. With `anywhere` it raises
wherever the signal lands: recording an op, autograd's C++ asking the device guard, a backward
pass, an optimizer step, a flush, the loop's own lines.

`python alarm_loop.py MODE TRIALS SEED [split|anywhere]` (run by tests/test_interrupts.py) prints
"interrupts N lost L bad B ..." and exits 1 if a value was lost or wrong; `split` cuts each flush
into programs of two ops, so that interrupts also land between the programs of one flush."""
from __future__ import annotations

import collections
import random
import signal
import sys

import torch

import deferfuse
from deferfuse import pending
from deferfuse.config import CONFIG

mode, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if sys.argv[4:] == ["split"]:
    CONFIG.max_group_ops = 2
anywhere = sys.argv[4:] == ["anywhere"]
rng = random.Random(seed)
_FLUSH = pending._flush.__code__


armed = False


def alarm(signum, frame):
    if not armed:  # a signal that came as the trial ended
        return
    f = frame  # where the signal arrived, also for a call that waited for the op or flush to end
    while f is not None and f.f_code is not _FLUSH:
        f = f.f_back
    raising = anywhere or f is not None  # or it arrived inside a flush
    # again, should this one's exception be swallowed (raised in a garbage collector callback):
    # after raising, once the trial has surely caught it and disarmed
    signal.setitimer(signal.ITIMER_REAL, 0.05 if raising else rng.uniform(0.0001, 0.0005))
    if raising:
        raise KeyboardInterrupt


def fresh(n, m, k):
    """The state after n SGD steps, m view writes and k foreach adds."""
    w = torch.full((256,), float(-n), device="tpu", requires_grad=True)
    v = torch.full((3, 5), float(-n), device="tpu", requires_grad=True)
    acc = torch.zeros(8, device="tpu")
    acc[2:6] = float(m)
    a, b = torch.full((4,), float(k), device="tpu"), torch.full((4,), float(k + 1), device="tpu")
    return w, v, torch.optim.SGD([w, v], lr=1.0), acc, a, b


at = ["sync"]  # the part of the iteration under way, for the check of the gradients


def step(w, v, opt, acc, a, b):
    """One iteration of each op, returning after each the op's index (for the caller's counts)."""
    at[0] = "backward"  # from here until the step begins, both gradients or neither
    ((w * 1).sum() + (v * 1).sum()).backward()  # both gradients are ones: SGD subtracts 1
    at[0] = "step"
    opt.step()
    yield 0
    at[0] = "zero_grad"  # Python sets each gradient to None in turn: one may be left
    opt.zero_grad()
    at[0] = "view"
    acc[2:6].add_(1)
    yield 1
    at[0] = "foreach"
    ones = torch.ones(8, device="tpu")
    torch._foreach_add_([a, b], [ones[:4], ones[4:]])
    yield 2
    at[0] = "sync"
    deferfuse.sync()


def grads_whole(w, v) -> bool:
    """Whether backward happened completely or not at all, as far as the part under way says."""
    gw, gv = w.grad, v.grad
    if at[0] == "zero_grad":
        return True
    if gw is None and gv is None:
        return at[0] != "step"
    return gw is not None and gv is not None and torch.equal(gw.cpu(), torch.ones(256)) and torch.equal(
        gv.cpu(), torch.ones(3, 5))


signal.signal(signal.SIGALRM, alarm)
counts = [0, 0, 0]  # SGD steps, view writes, foreach adds
state = fresh(*counts)
caught = lost = bad = 0
where = collections.Counter()  # the part each interrupt landed in
with deferfuse.mode(mode):
    for _ in range(3):  # compiled before the trials: an interrupt during a compile loses nothing
        for op in step(*state):
            counts[op] += 1
    for trial in range(trials):
        armed = True
        try:
            # anywhere: over about one iteration, so that every part of it is hit. Inside the try:
            # the previous trial's re-armed timer (alarm's) may fire here on a loaded machine,
            # now that the trial is armed, and its interrupt is this trial's
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, 0.012 if anywhere else 0.002))
            while True:
                for op in step(*state):
                    counts[op] += 1
        except KeyboardInterrupt:
            armed = False
            caught += 1
            where[at[0]] += 1
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        # an interrupt in Optimizer.step's own finally (a call before it restores grad mode) leaves
        # grad mode off, on CPU as well
        torch.set_grad_enabled(True)
        w, v, opt, acc, a, b = state
        try:
            whole = grads_whole(w, v)
            opt.zero_grad()
            at[0] = "sync"  # as after a whole iteration: no gradients
            hw, hv, hacc, ha, hb = w.detach().cpu(), v.detach().cpu(), acc.cpu(), a.cpu(), b.cpu()
        except deferfuse.FlushError as err:
            lost += 1
            print(f"trial {trial} lost: {err}", file=sys.stderr)
            state = fresh(*counts)
            continue
        n, m, k = counts
        # 1 where the interrupt came as the op returned, before its count
        extra = (-hw[0].item() - n, hacc[2].item() - m, ha[0].item() - k)
        ok = whole and all(e in (0, 1) for e in extra) and sum(extra) <= 1
        ok = ok and torch.equal(hw, torch.full((256,), hw[0].item())) and torch.equal(hv, torch.full((3, 5), hw[0].item()))
        ok = ok and torch.equal(hacc[[0, 1, 6, 7]], torch.zeros(4)) and torch.equal(hacc[2:6], torch.full((4,), hacc[2].item()))
        ok = ok and torch.equal(ha, torch.full((4,), ha[0].item())) and torch.equal(hb - ha, torch.ones(4))
        if not ok:
            bad += 1
            print(f"trial {trial} bad: in {at[0]}, gradients whole {whole}, counts {counts}, w {hw[:2].tolist()} "
                  f"v {hv[0, :2].tolist()} acc {hacc.tolist()} a {ha.tolist()} b {hb.tolist()}", file=sys.stderr)
            state = fresh(*counts)
            continue
        counts = [c + int(e) for c, e in zip(counts, extra)]
print("interrupts", caught, "lost", lost, "bad", bad, "steps", counts[0], "in", dict(where))
sys.exit(1 if lost or bad else 0)
