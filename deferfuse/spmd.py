"""Programs that span processes: collectives as JAX functions over a mesh of devices, one per
process, and the wrapper that runs a group program containing them on every process at once.

A collective's body (`body`) runs inside `jax.shard_map` on the mesh axis AXIS: each process
holds its own block, and `lax.psum`, `all_gather`, `psum_scatter`, `all_to_all` or `ppermute`
combine them. XLA picks the transport: ICI on TPU, NCCL on GPU, gloo on CPU. torch.distributed's
"tpu_dist" group (distributed/) runs them one by one; inside `spmd_safe()` they are recorded as
graph nodes, and a flush's program that holds one is an `SpmdProgram`.

Pure JAX: this module knows no torch.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = "ranks"

# Reductions by torch.distributed.ReduceOp name. Those XLA has a collective for use it; the
# others reduce an all-gather. Bool is reduced as int (gloo's sum of bools is "any").
BITWISE = {"BAND": jnp.bitwise_and, "BOR": jnp.bitwise_or, "BXOR": jnp.bitwise_xor}


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
        count = lax.psum(x.astype(jnp.int32), AXIS)
        if op in ("SUM", "MAX", "BOR"):
            return count > 0
        if op in ("PRODUCT", "MIN", "BAND"):
            return count == n
        return (count % 2) == 1  # BXOR
    if op == "SUM":
        return lax.psum(x, AXIS)
    if op == "AVG":
        return lax.psum(x, AXIS) / n  # floating point only (distributed/backend.py)
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


def body(kind: str, n: int, attrs: dict) -> Callable:
    """The per-block function of collective `kind` over n ranks: flat (1-D) block in, flat out."""
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


class AllReduce:
    """A recorded all-reduce's trace-time body, which program.py may combine with the others of
    its program: DDP's buckets, reduced one by one, cost a collective launch each (on our CPUs
    each launch costs more than a MiB of payload), so the program reduces them as one array
    where they are all ready before any is used."""

    def __init__(self, op: str, n: int):
        self.op = op
        self.n = n

    def __call__(self, ins, scs):
        return [reduce_block(ins[0], self.op, self.n)]


def all_reduce_many(reductions: list, blocks: list) -> list:
    """Every (AllReduce, flat block) pair reduced, those of one reduction and dtype as one."""
    by: dict[tuple, list[int]] = {}
    for k, (r, x) in enumerate(zip(reductions, blocks)):
        by.setdefault((r.op, x.dtype), []).append(k)
    out = [None] * len(blocks)
    for (op, _), ks in by.items():
        xs = [blocks[k] for k in ks]
        whole = reduce_block(jnp.concatenate(xs) if len(xs) > 1 else xs[0], op, reductions[ks[0]].n)
        at = 0
        for k, x in zip(ks, xs):
            out[k] = whole[at:at + x.shape[0]]
            at += x.shape[0]
    return out


def out_length(kind: str, n: int, m: int) -> int:
    """The flat length of a collective's result on each rank, for a flat input of m."""
    if kind == "all_gather":
        return n * m
    if kind in ("reduce_scatter", "scatter"):
        return m // n
    return m


def to_global(m: Mesh, local: jax.Array) -> jax.Array:
    """The global array whose block on this process is `local` (rank-major along dim 0)."""
    n = m.devices.size
    return jax.make_array_from_single_device_arrays((n * local.shape[0], *local.shape[1:]),
                                                    NamedSharding(m, P(AXIS)), [local])


class SpmdProgram:
    """A group program that holds collectives, run on every process of `mesh` at once.

    fn(inputs, scalars) is the group program as program.py builds it, for this process's
    blocks. Here it runs inside shard_map: each input is this process's block of a global array
    (rank-major along dim 0; a 0-d value travels as one element), scalars are the same on every
    rank (the `spmd_safe` promise), and each output comes back as this process's block."""

    def __init__(self, fn: Callable, m: Mesh, in_ndims: list[int], out_ndims: list[int]):
        self.mesh = m
        self.in_ndims = in_ndims
        self.out_ndims = out_ndims

        def blocks(inputs, scalars):
            ins = [x.reshape(()) if nd == 0 else x for x, nd in zip(inputs, in_ndims)]
            outs = fn(ins, scalars)
            return [o.reshape(1) if nd == 0 else o for o, nd in zip(outs, out_ndims)]

        # check_vma off: the lowerings are ordinary JAX written for one device (a jax.vjp among
        # them), which mixes values that vary across ranks with ones made in the program
        self.jitted = jax.jit(jax.shard_map(blocks, mesh=m, in_specs=(P(AXIS), P()), out_specs=P(AXIS),
                                            check_vma=False))
        self.__wrapped__ = None  # no donating variants (cache/runtime.py)

    def __call__(self, inputs, scalars):
        m = self.mesh
        glob = [to_global(m, x.reshape(1) if nd == 0 else x) for x, nd in zip(inputs, self.in_ndims)]
        outs = self.jitted(glob, scalars)
        return [o.addressable_shards[0].data.reshape(()) if nd == 0 else o.addressable_shards[0].data
                for o, nd in zip(outs, self.out_ndims)]
