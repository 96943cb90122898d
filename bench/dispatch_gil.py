"""Does a JAX dispatch leave the calling thread free? (Whether launching Strict's programs from a
second thread could hide their cost.)

    python bench/dispatch_gil.py [--calls 3000]

Plain JAX, no torch: a compiled 8-element add called in a loop, alone; the same loop on a second
thread beside a pure-Python loop on the main thread, at three GIL switch intervals; and the calls
fed one by one through a queue to a worker while the main thread does a little Python per call,
as a launch thread would be fed. If the dispatch released the GIL while the device runtime works,
the pairs would take about as long as the longer of the two alone; if it holds the thread, as
long as both one after the other.
"""
from __future__ import annotations

import argparse
import queue
import sys
import threading
import time

import jax
import jax.numpy as jnp


def _python(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    a = p.parse_args(argv)
    n = a.calls
    x = jnp.arange(8, dtype=jnp.float32)
    add = jax.jit(lambda v: v + 1).lower(x).compile()

    def calls():
        y = x
        for _ in range(n):
            y = add(y)
        y.block_until_ready()

    calls()
    t0, c0 = time.perf_counter(), time.thread_time()
    calls()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    print(f"{jax.devices()[0].device_kind}: a call {wall / n * 1e6:.1f} us, of it the calling thread's CPU "
          f"{cpu / n * 1e6:.1f} us")
    work = 1000 * n  # on a TPU v5e's host about half as long as the calls (0.2 s against 0.38 s at 3,000)
    for interval in (0.005, 0.0005, 0.00005):
        sys.setswitchinterval(interval)
        alone_calls, alone_py = _timed(calls), _timed(_python, work)
        side: dict = {}
        worker = threading.Thread(target=lambda: side.setdefault("calls", _timed(calls)))
        t0 = time.perf_counter()
        worker.start()
        py = _timed(_python, work)
        worker.join()
        both = time.perf_counter() - t0
        print(f"switch interval {interval * 1e3:.2f} ms: calls {alone_calls:.3f} s and Python {alone_py:.3f} s alone "
              f"({alone_calls + alone_py:.3f} s one after the other); on two threads {both:.3f} s (calls "
              f"{side['calls']:.3f} s, Python {py:.3f} s)")
    sys.setswitchinterval(0.005)
    q: queue.SimpleQueue = queue.SimpleQueue()

    def serve():
        while (item := q.get()) is not None:
            item(x)

    worker = threading.Thread(target=serve)
    t0 = time.perf_counter()
    worker.start()
    for _ in range(n):
        q.put(add)
        _python(300)
    q.put(None)
    worker.join()
    fed = time.perf_counter() - t0
    print(f"fed through a queue: {fed:.3f} s, against {alone_calls:.3f} s of calls and "
          f"{_timed(lambda: [_python(300) for _ in range(n)]):.3f} s of Python one after the other")


if __name__ == "__main__":
    main()
