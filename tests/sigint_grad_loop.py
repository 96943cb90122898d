"""Forward and backward passes on two parameters while another thread sends SIGINT at random
moments: Python's own Ctrl-C handler for the first half of the trials, a SIGINT handler of the
user's own for the second. Ctrl-C used to abort the process ("terminate called without an active
exception", exit 134), in backward and as autograd recorded an op's history: its C++ asks the
tpu's device guard, a Python object, and a handler's exception there cannot propagate.

After each KeyboardInterrupt the gradients are both there and complete, or neither (before
`backward()` clears them; while Python sets them to None they may be half), and one that came
through `backward()` came after it returned, with both. Run by tests/test_interrupts.py:
`python sigint_grad_loop.py MODE TRIALS SEED` prints "interrupts N backward B" and exits 0."""
from __future__ import annotations

import math
import os
import random
import signal
import sys
import threading
import time

import torch

import deferfuse

mode, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
ready = threading.Event()


def pester():
    """One SIGINT at a random moment of each trial, sent only once the loop runs again."""
    while True:
        ready.wait()
        ready.clear()
        time.sleep(rng.uniform(0.0002, 0.004))
        os.kill(os.getpid(), signal.SIGINT)


def users_own(signum, frame):
    raise KeyboardInterrupt


w = torch.full((64,), 2.0, device="tpu", requires_grad=True)
v = torch.full((3, 5), 3.0, device="tpu", requires_grad=True)
gw, gv = torch.full((64,), 2 * math.cos(4.0)), torch.full((3, 5), -3 * math.sin(9.0))
at = ["clear"]


def through_backward(err: BaseException) -> bool:
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_engine_run_backward":
            return True
        tb = tb.tb_next
    return False


threading.Thread(target=pester, daemon=True).start()
caught = after_backward = 0
with deferfuse.mode(mode):
    for _ in range(3):
        ((w * 2).sin().sum() + (v * 3).cos().sum()).backward()
    for trial in range(trials):
        if trial == trials // 2:
            signal.signal(signal.SIGINT, users_own)
        ready.set()
        try:
            while True:
                at[0] = "clear"
                w.grad = v.grad = None
                at[0] = "backward"
                ((w * 2).sin().sum() + (v * 3).cos().sum()).backward()
        except KeyboardInterrupt as err:
            caught += 1
            through = through_backward(err)
            after_backward += through
        both = w.grad is not None and v.grad is not None
        if both:
            assert torch.allclose(w.grad.cpu(), gw) and torch.allclose(v.grad.cpu(), gv), trial
        else:
            assert at[0] == "clear" or (w.grad is None and v.grad is None), (trial, w.grad, v.grad)
        assert both or not through, trial  # through backward: raised once it had returned
        assert torch.equal(w.detach().cpu(), torch.full((64,), 2.0)) and torch.equal(v.detach().cpu(), torch.full((3, 5), 3.0))
print("interrupts", caught, "backward", after_backward)
