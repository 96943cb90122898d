"""Collectives as small SPMD programs: XLA's own collectives over a mesh of the group's devices.

Each process holds its part as a local array on its own device. A collective builds the global
array those parts make (one block per rank, `make_array_from_single_device_arrays`, no copy) and
runs a jitted `shard_map` whose body is `lax.psum`, `all_gather`, `psum_scatter`, `all_to_all`
or `ppermute` on the mesh axis; each process keeps its own block of the result. XLA picks the
transport: ICI on TPU, NCCL on GPU, gloo on CPU.

Every array here is flat (1-D): the torch side hands over `t.reshape(-1)` and views the result
back, so one program serves every shape with the same element count.

Programs are kept per (collective, group, length, dtype, attributes), and counted with every
other program deferfuse compiles; JAX's persistent cache (persistent.py) keeps them on disk.
This module is pure JAX: it knows no torch.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import events
from ..causes import Cause
from ..events import METRICS

AXIS = "ranks"

# Reductions by torch.distributed.ReduceOp name. Those XLA has a collective for use it; the
# others reduce an all-gather. Bool is summed as int (gloo's sum of bools is "any").
BITWISE = {"BAND": jnp.bitwise_and, "BOR": jnp.bitwise_or, "BXOR": jnp.bitwise_xor}
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", *BITWISE)


@functools.cache
def mesh(ranks: tuple[int, ...]) -> Mesh:
    """The mesh of these processes' devices, in the group's rank order (process index = rank)."""
    own = {}
    for d in jax.devices():
        own.setdefault(d.process_index, d)
    return Mesh(np.array([own[r] for r in ranks]), (AXIS,))


def reduce_block(x, op: str, n: int):
    """Inside a shard_map: the reduction `op` of every rank's x."""
    if x.dtype == jnp.bool_:
        if op in ("SUM", "MAX", "BOR"):
            return lax.psum(x.astype(jnp.int32), AXIS) > 0
        if op in ("PRODUCT", "MIN", "BAND"):
            return lax.psum(x.astype(jnp.int32), AXIS) == n
        return (lax.psum(x.astype(jnp.int32), AXIS) % 2) == 1  # BXOR
    if op == "SUM":
        return lax.psum(x, AXIS)
    if op == "AVG":
        return lax.psum(x, AXIS) / n  # floating point only (backend.py)
    if op == "MIN":
        return lax.pmin(x, AXIS)
    if op == "MAX":
        return lax.pmax(x, AXIS)
    every = lax.all_gather(x, AXIS)  # (n, m)
    if op == "PRODUCT":
        return jnp.prod(every, axis=0, dtype=x.dtype)
    return functools.reduce(BITWISE[op], [every[k] for k in range(n)])


def _broadcast_block(x, root: int):
    """root's x on every rank, bit for bit: the others add zero bits (a float sum would turn
    -0.0 into 0.0)."""
    keep = lax.axis_index(AXIS) == root
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return lax.all_gather(x, AXIS)[root]
    if x.dtype == jnp.bool_:
        return lax.psum(jnp.where(keep, x, False).astype(jnp.int32), AXIS) > 0
    bits = jnp.dtype(f"uint{x.dtype.itemsize * 8}")
    raw = lax.bitcast_convert_type(x, bits)
    return lax.bitcast_convert_type(lax.psum(jnp.where(keep, raw, 0), AXIS), x.dtype)


def _body(kind: str, n: int, attrs: dict) -> Callable:
    if kind == "all_reduce":
        return lambda x: reduce_block(x, attrs["op"], n)
    if kind == "broadcast":
        return lambda x: _broadcast_block(x, attrs["root"])
    if kind == "all_gather":
        return lambda x: lax.all_gather(x, AXIS, tiled=True)
    if kind == "reduce_scatter":
        def reduce_scatter(x):
            if attrs["op"] == "SUM" and x.dtype != jnp.bool_:
                return lax.psum_scatter(x, AXIS, tiled=True)
            k = x.shape[0] // n
            return lax.dynamic_slice_in_dim(reduce_block(x, attrs["op"], n), lax.axis_index(AXIS) * k, k)
        return reduce_scatter
    if kind == "all_to_all":
        return lambda x: lax.all_to_all(x, AXIS, 0, 0, tiled=True)
    if kind == "scatter":  # every rank gets its chunk of root's x
        def scatter(x):
            k = x.shape[0] // n
            return lax.dynamic_slice_in_dim(lax.all_to_all(x, AXIS, 0, 0, tiled=True), attrs["root"] * k, k)
        return scatter
    if kind == "permute":  # (source, destination) pairs of group ranks; others receive zeros
        return lambda x: lax.ppermute(x, AXIS, attrs["pairs"])
    raise ValueError(f"deferfuse: unknown collective {kind!r}")


_PROGRAMS: dict[tuple, Callable] = {}


def run(kind: str, ranks: tuple[int, ...], local: jax.Array, **attrs) -> jax.Array:
    """This process's block of collective `kind` over the processes `ranks`, given its own flat
    block `local` (on its own device)."""
    key = (kind, ranks, local.shape, local.dtype, tuple(sorted(attrs.items())))
    fn = _PROGRAMS.get(key)
    m = mesh(ranks)
    if fn is None:
        METRICS.cache_misses += 1
        METRICS.programs_built += 1
        fn = jax.jit(jax.shard_map(_body(kind, len(ranks), attrs), mesh=m, in_specs=P(AXIS), out_specs=P(AXIS)))
        t0 = time.perf_counter()
        fn.lower(_global(m, local)).compile()
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
    out = fn(_global(m, local))
    return out.addressable_shards[0].data


def _global(m: Mesh, local: jax.Array) -> jax.Array:
    n = m.devices.size
    return jax.make_array_from_single_device_arrays((n * local.shape[0],), NamedSharding(m, P(AXIS)), [local])


def clear() -> None:
    _PROGRAMS.clear()
    mesh.cache_clear()
