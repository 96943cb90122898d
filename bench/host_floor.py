"""How low can DeferAndFuse's host cost per step go, with the user's Python still running each step?

    python bench/host_floor.py [--reps 5] [--steps 200] [--workload "gpt host (4 layers, d16, T8, B2)"]

Issue 41 asks for a "trace replay": record a training step once, then on later steps match each
op against the trace and feed the cached program. DeferAndFuse does that now (executors/replay.py);
this puts it beside DeferAndFuse recording every step (`DEFERFUSE_REPLAY=0`, the "recorded"
column) and beside the best any such design can do: the "replay floor" engine serves every
top-level op of a step from a trace of the previous step (output tensors with the recorded
metadata, or the input an in-place op returns), with no check that the op matches, no graph and no
program. What remains there is the model's and the optimizer's Python, PyTorch's dispatch into
`__torch_dispatch__` and its autograd engine, and making the output tensors. A real replay pays
that, its checks, and the step's program call (the flush column: what DeferAndFuse's one flush per
step costs).

Same process, interleaved repetitions, medians, thread CPU time (not wall: the machines are
shared), one intra-op thread for every engine, the `gpt host` workload (bench/workloads.py) unless
`--workload` names another.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import deferfuse
from deferfuse import dispatch
from deferfuse.config import CONFIG
from deferfuse.events import METRICS
from deferfuse.tensor import Storage, TpuTensor, new_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import workloads  # noqa: E402

HOST = "gpt host (4 layers, d16, T8, B2)"


class TraceServer:
    """Records the top-level ops of one step, then serves later steps from the record."""

    def __init__(self):
        self.real = dispatch.torch_dispatch
        self.trace: list = []
        self.pos = 0

    def _tensors(self, args, kwargs):
        return [a for a in tree_flatten((args, kwargs))[0] if type(a) is TpuTensor]

    def record(self, cls, func, types, args=(), kwargs=None):
        top = dispatch.CALL.depth == 0
        out = self.real(cls, func, types, args, kwargs)
        if top:
            ins = self._tensors(args, kwargs or {})
            leaves, spec = tree_flatten(out)
            made = []
            for t in leaves:
                if type(t) is not TpuTensor:
                    made.append(("const", t))
                    continue
                k = next((i for i, a in enumerate(ins) if a is t), None)
                if k is not None:  # an in-place op returns its input
                    made.append(("arg", k))
                else:
                    made.append(("new", (tuple(t.shape), tuple(t.stride()), t.dtype, t._lid, t._lay, t._st.shape)))
            self.trace.append((func, made, spec))
        return out

    def serve(self, cls, func, types, args=(), kwargs=None):
        if dispatch.CALL.depth:
            return self.real(cls, func, types, args, kwargs)
        want, made, spec = self.trace[self.pos]
        self.pos += 1
        if want is not func:
            raise AssertionError(f"the step changed: {func} where the trace has {want}")
        ins = None
        out = []
        for kind, what in made:
            if kind == "new":
                size, stride, dtype, lid, lay, phys = what
                out.append(new_tensor(Storage(None, phys, dtype), size, stride, dtype, lid, lay))
            elif kind == "arg":
                ins = ins if ins is not None else self._tensors(args, kwargs or {})
                out.append(ins[what])
            else:
                out.append(what)
        return tree_unflatten(out, spec)

    def use(self, handler) -> None:
        TpuTensor.__torch_dispatch__ = classmethod(handler)


def _timed(step, n: int, replay: bool = True) -> float:
    CONFIG.replay, was = replay, CONFIG.replay
    try:
        t0 = time.thread_time()
        for _ in range(n):
            step()
        return (time.thread_time() - t0) / n * 1e3
    finally:
        CONFIG.replay = was


# "recorded": DeferAndFuse with its step replay off (executors/replay.py), every step recorded
ENGINES = ("cpu", "recorded", "defer", "floor", "compiled")


def measure(reps: int, steps: int, workload: str = HOST) -> dict:
    """Thread CPU ms per step of each engine, per repetition; DeferAndFuse's flush per step (wall
    ms, deferfuse's own metric); how many ops the floor served per step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(reps, steps, workload)
    finally:
        torch.set_num_threads(threads)


def _measure(reps: int, steps: int, workload: str) -> dict:
    make = workloads.WORKLOADS[workload]
    cpu, defer, compiled, recorded = make("cpu"), make("defer_and_fuse"), make("compiled"), make("defer_and_fuse")
    for r in (cpu, defer, compiled, recorded):
        for _ in range(5):
            r.step()
        r.sync()
    server = TraceServer()
    server.use(server.record)  # one step's top-level ops (its first op flushes the step before)
    try:
        defer.step()
    finally:
        server.use(server.real)
    defer.sync()

    def floor_step():
        server.pos = 0
        server.use(server.serve)
        try:
            defer.step()
        finally:
            server.use(server.real)
        if server.pos != len(server.trace):
            raise AssertionError(f"the step made {server.pos} ops, the trace has {len(server.trace)}")

    times: dict[str, list[float]] = {k: [] for k in ENGINES}
    flush_ms = []
    for _ in range(reps):
        times["cpu"].append(_timed(cpu.step, steps))
        times["recorded"].append(_timed(recorded.step, steps, replay=False))
        recorded.sync()
        f0, n0 = METRICS.flush_seconds, sum(METRICS.flushes.values())
        times["defer"].append(_timed(defer.step, steps))
        flush_ms.append((METRICS.flush_seconds - f0) / max(1, sum(METRICS.flushes.values()) - n0) * 1e3)
        defer.sync()
        times["floor"].append(_timed(floor_step, steps, replay=False))  # its factories still reach deferfuse
        times["compiled"].append(_timed(compiled.step, steps))
        compiled.sync()
    return {"times": times, "flush_ms": flush_ms, "ops": len(server.trace), "reps": reps, "steps": steps,
            "workload": workload}


def render(res: dict) -> str:
    med = {k: statistics.median(v) for k, v in res["times"].items()}
    flush = statistics.median(res["flush_ms"])
    floor = med["floor"] + flush
    return "\n".join([
        f"## Host cost per step, {res['workload']} (thread CPU ms, median of {res['reps']} x {res['steps']} steps, "
        "one thread)",
        "",
        "| CPU eager | DeferAndFuse, recorded | DeferAndFuse, replayed | its flush (wall) | replay floor "
        "| floor + flush | compiled | recorded / compiled | replayed / compiled | (floor + flush) / compiled |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {med['cpu']:.2f} | {med['recorded']:.2f} | {med['defer']:.2f} | {flush:.2f} | {med['floor']:.2f} "
        f"| {floor:.2f} | {med['compiled']:.2f} | {med['recorded'] / med['compiled']:.2f} "
        f"| {med['defer'] / med['compiled']:.2f} | {floor / med['compiled']:.2f} |",
        "",
        f"ops served from the trace per step: {res['ops']}; spread (max/min) per engine: "
        + ", ".join(f"{k} {max(v) / min(v):.2f}" for k, v in res["times"].items()),
    ])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--workload", default=HOST, choices=sorted(workloads.WORKLOADS))
    a = p.parse_args(argv)
    print(render(measure(a.reps, a.steps, a.workload)))


if __name__ == "__main__":
    main()
