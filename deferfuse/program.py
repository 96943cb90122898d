"""Turn a group of recorded nodes into one JAX function, ready for `jax.jit`.

The function is an interpreter over the nodes that runs only while JAX traces it; the compiled
XLA program contains just the ops. Inputs arrive by position, runtime scalars as a list (or, from
two numbers on, packed into one array per kind: `scalar_layout`), so the same program serves every
flush with the same structure.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .graph import OUT_BITS, Node
from .spmd import AllReduce, all_reduce_many

try:  # the one way to make a weakly typed value inside a trace, as JAX makes a Python number
    from jax._src.lax.lax import _convert_element_type
except ImportError:  # pragma: no cover - a JAX without it: numbers are passed one by one
    _convert_element_type = None


def build(
    nodes: Sequence[Node],
    node_ids: Sequence[int],
    in_refs: Sequence[int],
    out_refs: Sequence[int],
    scalar_ids: Sequence[int] | None = None,
) -> Callable:
    """fn(inputs, scalars) -> outputs for the nodes `node_ids` (indices into `nodes`).

    `scalar_ids` maps the group's scalar list to graph scalar positions; None means the group
    receives the graph's whole scalar list.
    """
    steps = [(i, nodes[i]) for i in node_ids]
    in_refs = list(in_refs)
    out_refs = list(out_refs)
    if scalar_ids is None:
        remap = None
    else:
        remap = {g: k for k, g in enumerate(scalar_ids)}

    def fn(inputs, scalars):
        env = dict(zip(in_refs, inputs))
        # all-reduces recorded in spmd_safe() wait here until a later node reads one of them (or
        # the end), then run as one (spmd.all_reduce_many): one collective launch, not one per bucket
        held: dict[int, tuple] = {}

        def settle():
            refs = list(held)
            outs = all_reduce_many([held[r][0] for r in refs], [held[r][1] for r in refs])
            env.update(zip(refs, outs))
            held.clear()

        for i, node in steps:
            op = node.op
            if held and any(r in held for r in node.inputs):
                settle()
            if type(op.fn) is AllReduce:
                held[i << OUT_BITS] = (op.fn, env[node.inputs[0]])
                continue
            ins = [env[r] for r in node.inputs]
            n = op.n_scalars
            if n:
                lo = node.scalar_lo
                if remap is None:
                    scs = scalars[lo : lo + n]
                else:
                    scs = [scalars[remap[lo + k]] for k in range(n)]
            else:
                scs = ()
            outs = op.fn(ins, scs)
            base = i << OUT_BITS
            for k, o in enumerate(outs):
                env[base | k] = o
        if held:
            settle()
        return [env[r] for r in out_refs]

    return fn


# Each Python number passed to a jitted function costs a buffer per call (JAX makes each one a
# buffer of its own); an array of any length costs one. An AdamW step passes two numbers per
# parameter (step size, bias correction), so a GPT step's program takes over a hundred.
# From two numbers on, a program takes its floats as one float64 array and its ints as one int64
# array, and unpacks them in the trace as the weakly typed scalars JAX would have made of them, so
# the traced program and its dtypes are the same.
PACK_MIN = 2
_F64 = np.dtype("float64")
_I64 = np.dtype("int64")


def scalar_layout(values: Sequence) -> tuple | None:
    """(float positions, int positions, other positions) of a program's runtime scalars when
    they are worth packing, else None. Runtime scalars are Python floats, Python ints in int64's
    range (meta.signature) and 0-dim numpy arrays; their types are part of the program's key."""
    if _convert_element_type is None:
        return None
    floats = tuple(k for k, v in enumerate(values) if type(v) is float)
    ints = tuple(k for k, v in enumerate(values) if type(v) is int)
    if len(floats) + len(ints) < PACK_MIN:
        return None
    return floats, ints, tuple(k for k, v in enumerate(values) if type(v) is not float and type(v) is not int)


def pack(values: Sequence, floats, ints, other) -> tuple:
    """What an unpacking program takes for `values`, indexed by the positions `scalar_layout`
    gave (or by positions in a longer list: a flush's scalars)."""
    return (
        np.array([values[k] for k in floats], _F64) if floats else None,
        np.array([values[k] for k in ints], _I64) if ints else None,
        [values[k] for k in other],
    )


def unpacking(fn: Callable, layout: tuple) -> Callable:
    """fn(inputs, scalars) as a function of (inputs, packed scalars)."""
    floats, ints, other = layout
    n = len(floats) + len(ints) + len(other)
    weak = _convert_element_type

    def packed_fn(inputs, packed):
        f, i, rest = packed
        scalars = [None] * n
        for k, pos in enumerate(floats):
            scalars[pos] = weak(f[k], _F64, weak_type=True)
        for k, pos in enumerate(ints):
            scalars[pos] = weak(i[k], _I64, weak_type=True)
        for k, pos in enumerate(other):
            scalars[pos] = rest[k]
        return fn(inputs, scalars)

    return packed_fn


def run_host(node: Node, inputs, scalars):
    """A host (CPU fallback) node runs eagerly on concrete values."""
    op = node.op
    lo = node.scalar_lo
    return op.fn(inputs, scalars[lo : lo + op.n_scalars])
