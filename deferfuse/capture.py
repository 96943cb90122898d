"""Capture one step as a single program and replay it without running Python: the "jit" limit.

`deferfuse.capture(step, *args)` records `step(*args)` once in DeferAndFuse with every cut
disabled, so the whole step becomes one flush, and returns a `Captured` whose call replays that
program on new arguments. It is what `bench/` calls the `jit` engine: the same lowering and the
same program, with recording taken out, so the gap between it and DeferAndFuse is exactly what
recording costs.

A replay reads the *current* value of every storage the step read (parameters, optimizer state:
their updates chain from one replay to the next), substitutes the new arguments for the captured
ones, and writes the program's outputs back into the storages the step wrote. Python-side effects
of the step (an optimizer's CPU step counter, scalars computed from it, RNG counters) are frozen
at their captured values; use it for steps whose Python part is static.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from .causes import Cause
from . import cache, interrupts, pending
from .config import CONFIG
from .events import METRICS
from .graph import Graph
from .modes import DeferfuseMode
from .tensor import TpuTensor


class Captured:
    def __init__(self, result, graph: Graph, outputs, plan, args):
        self.result = result
        arg_pos = {id(a._st): i for i, a in enumerate(args) if isinstance(a, TpuTensor)}
        # per program input: the argument it came from, else the storage (read afresh each
        # replay), else the captured array itself (a constant such as a host-to-device copy)
        self._feeds = []
        for src, captured in zip(graph.sources, graph.inputs):
            st = src()
            if st is not None and id(st) in arg_pos:
                self._feeds.append(("arg", arg_pos[id(st)]))
            elif st is not None:
                self._feeds.append(("storage", src, captured))
            else:
                self._feeds.append(("const", captured))
        self._scalars = list(graph.scalars)
        self._outputs = outputs  # (storage, index into the program's outputs)
        self._written = {id(st) for st, _ in outputs}
        self._plan = plan
        self.programs = len(plan.steps)

    def __call__(self, *args) -> Any:
        if any(isinstance(a, TpuTensor) and (a._st.value is None or a._lay is not None) for a in args):
            pending.flush(Cause.CAPTURE)
        inputs = []
        # storages the replay overwrites hand their old value over (st.value cleared), so the
        # program may donate its buffer to the new value when nothing else holds it
        handed = []
        written = self._written
        single = self._plan.single
        variants = single.compiled
        t0 = time.perf_counter()
        # from before the first value is handed over until the new ones are in place, a signal
        # handler's exception waits (interrupts.py)
        interrupts.hold()
        try:
            for feed in self._feeds:
                if feed[0] == "arg":
                    inputs.append(args[feed[1]]._st.value)
                elif feed[0] == "storage":
                    st = feed[1]()
                    if st is not None and st.value is not None:
                        inputs.append(st.value)
                        if id(st) in written:
                            handed.append((st, len(inputs) - 1))
                            st.value = None
                    else:
                        inputs.append(feed[2])
                else:
                    inputs.append(feed[1])
            try:
                values = single.run(inputs, self._scalars, lambda: self._replaces(handed))
            except BaseException:
                for st, pos in handed:
                    st.value = inputs[pos]
                raise
            for st, idx in self._outputs:
                st.value = values[idx]
        finally:
            interrupts.release()
        if single.compiled != variants:  # the first replay compiled the donating variant
            METRICS.cache_misses += 1
            METRICS.compile_seconds += time.perf_counter() - t0
        return self.result

    def _replaces(self, handed) -> dict[int, int]:
        """Input position -> output position of each storage the replay reads and overwrites."""
        out_of = {id(st): idx for st, idx in self._outputs}
        return {pos: out_of[id(st)] for st, pos in handed}


def capture(step: Callable[..., Any], *args: Any) -> Captured:
    """Record `step(*args)` as one program; see the module docstring for what replays."""
    pending.flush(Cause.CAPTURE)
    result, g, outputs, plan = record_whole(step, args, Cause.CAPTURE)
    if g is None:
        raise RuntimeError("deferfuse.capture: the step flushed before its end (a host read or a CPU "
                           "fallback inside it); only steps that record as one graph can be captured")
    if plan is None:
        raise RuntimeError("deferfuse.capture: the step computes nothing on tpu")
    if plan.single is None:
        raise RuntimeError("deferfuse.capture: the step needs several programs (a CPU fallback in it)")
    return Captured(result, g, outputs, plan, args)


def record_whole(step: Callable[..., Any], args, cause: Cause, where=None):
    """Run `step(*args)` in DeferAndFuse with every cut disabled and flush it as one program.

    Returns (result, graph, outputs, plan): `graph.sources` names the storage each program input
    was read from, `outputs` pairs each storage the flush wrote with its index among the program's
    outputs, and `plan.single` is the program (None when it needs several). The graph is None when
    the step flushed before its end (a host read inside it: the step still ran, in pieces), the
    plan None when it recorded nothing. Nothing may be pending when it is called. Shared by `capture` and the
    torch.compile backend (deferfuse/compiler), so both run the lowerings and the cache of eager.
    `where`: the user's line the flush is reported at (the graph's ops record their own)."""
    stream = pending.PENDING
    saved = (stream.period.lookback, CONFIG.max_pending, CONFIG.max_group_ops, CONFIG.fuse_block_ops)
    stream.period.lookback = CONFIG.fuse_block_ops = 0  # the flush before this reset the detector
    CONFIG.max_pending = CONFIG.max_group_ops = 1 << 30
    stream.graph.sources = []
    stream.captured = None
    g0 = stream.graph
    try:
        with DeferfuseMode("defer_and_fuse"):
            result = step(*args)
            g = stream.graph
            if g is not g0:  # a flush inside the step started a new graph
                return result, None, [], None
            if not g.nodes:
                return result, g, [], None
            pending.flush(cause, where)
    finally:
        stream.period.lookback, CONFIG.max_pending, CONFIG.max_group_ops, CONFIG.fuse_block_ops = saved
        stream.graph.sources = None
    if stream.captured is None or stream.captured[0] is not g:
        return result, None, [], None
    _, out_refs, outputs, plan = stream.captured
    if plan.single is None:  # the cached plan for this graph cuts it around repetitions
        plan = cache.one_program(g, out_refs)
    return result, g, outputs, plan
