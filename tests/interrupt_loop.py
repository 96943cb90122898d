"""Record and flush in a loop while another thread sends SIGINT at random moments; after each
KeyboardInterrupt, check that every op either happened completely or not at all and that every
tensor still reads back (never zeros, never an error). Run by tests/test_interrupts.py:
`python interrupt_loop.py MODE SECONDS SEED [INTERRUPTS]` runs for SECONDS, and on until INTERRUPTS
were caught (a loaded machine runs fewer iterations a second) or ten times SECONDS passed; it prints
"interrupts N" and exits 0, or fails."""
from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import torch

import deferfuse

mode, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
wanted = int(sys.argv[4]) if len(sys.argv) > 4 else 0
rng = random.Random(seed)
ready, done = threading.Event(), threading.Event()


def pester():
    """One SIGINT at a random moment of each run of the loop below: it is sent only once the loop
    is running again, so it never lands in the checks."""
    while not done.is_set():
        if ready.wait(0.1):
            time.sleep(rng.uniform(0.0002, 0.01))
            ready.clear()
            os.kill(os.getpid(), signal.SIGINT)


acc = torch.zeros(8, device="tpu")  # +1 per iteration; its middle also +1 through a view
a, b = torch.zeros(4, device="tpu"), torch.ones(4, device="tpu")  # one foreach op adds to both
x = torch.arange(4.0, device="tpu")
n = m = k = 0
caught = 0
threading.Thread(target=pester, daemon=True).start()
start = time.time()
with deferfuse.mode(mode):
    while time.time() < start + seconds or (caught < wanted and time.time() < start + 10 * seconds):
        try:
            ready.set()
            while True:
                acc.add_(1)
                n += 1
                acc[2:6].add_(1)
                m += 1
                torch._foreach_add_([a, b], [x * 0 + 1, x.sign() * 0 + 1])
                k += 1
                if n % 13 == 0:
                    acc.sum().item()
        except KeyboardInterrupt:
            caught += 1
        host, ha, hb = acc.cpu(), a.cpu(), b.cpu()
        base, mid = host[0].item(), (host[2] - host[0]).item()
        extra = (base - n, mid - m, ha[0].item() - k)  # 1 where the interrupt came as an op returned
        assert all(e in (0, 1) for e in extra) and sum(extra) <= 1, (mode, n, m, k, host.tolist(), ha.tolist())
        assert (torch.equal(host[[0, 1, 6, 7]], torch.full((4,), base))
                and torch.equal(host[2:6], torch.full((4,), base + mid)))
        assert torch.equal(hb - ha, torch.ones(4)) and torch.equal(ha, torch.full((4,), ha[0].item())), (ha, hb)
        n, m, k = n + extra[0], m + extra[1], k + extra[2]
done.set()
print("interrupts", caught, "iterations", n)
