"""One collective, one program: XLA's own collectives over a mesh of the group's devices.

Each process holds its part as a local array on its own device. A collective builds the global
array those parts make (one block per rank, `make_array_from_single_device_arrays`, no copy) and
runs a jitted `shard_map` of the collective's body (spmd.py); each process keeps its own block of
the result. (Inside `spmd_safe()` the same bodies are recorded into the step's program instead.)

Every array here is flat (1-D): the torch side hands over `t.reshape(-1)` and views the result
back, so one program serves every shape with the same element count.

Programs are kept per (collective, group, length, dtype, attributes), and counted with every
other program deferfuse compiles; JAX's persistent cache (persistent.py) keeps them on disk.
This module is pure JAX: it knows no torch.
"""
from __future__ import annotations

import time
from typing import Callable

import jax
from jax.sharding import PartitionSpec as P

from .. import events, spmd
from ..causes import Cause
from ..events import METRICS

_PROGRAMS: dict[tuple, Callable] = {}


def run(kind: str, ranks: tuple[int, ...], local: jax.Array, **attrs) -> jax.Array:
    """This process's block of collective `kind` over the processes `ranks`, given its own flat
    block `local` (on its own device)."""
    key = (kind, ranks, local.shape, local.dtype, tuple(sorted(attrs.items())))
    fn = _PROGRAMS.get(key)
    m = spmd.mesh(ranks)
    if fn is None:
        METRICS.cache_misses += 1
        METRICS.programs_built += 1
        fn = jax.jit(jax.shard_map(spmd.body(kind, len(ranks), attrs), mesh=m, in_specs=P(spmd.AXIS),
                                   out_specs=P(spmd.AXIS)))
        t0 = time.perf_counter()
        fn.lower(spmd.to_global(m, local)).compile()
        dt = time.perf_counter() - t0
        METRICS.compile_seconds += dt
        events.emit("compile", where=None, cause=Cause.DISTRIBUTED_OP, seconds=dt, ops=1, key=hash(key),
                    groups=1, op_names=[kind], why=None, recompile=False, breaks=[None], program_sizes=[1],
                    hosts=[False])
        _PROGRAMS[key] = fn
    else:
        METRICS.cache_hits += 1
    METRICS.execute_calls += 1
    METRICS.collectives[kind] += 1
    out = fn(spmd.to_global(m, local))
    return out.addressable_shards[0].data
