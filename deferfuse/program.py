"""Turn a group of recorded nodes into one JAX function, ready for `jax.jit`.

The function is an interpreter over the nodes that runs only while JAX traces it; the compiled
XLA program contains just the ops. Inputs arrive by position, runtime scalars as a list, so the
same program serves every flush with the same structure.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .graph import OUT_BITS, Node


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
        for i, node in steps:
            op = node.op
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
        return [env[r] for r in out_refs]

    return fn


def run_host(node: Node, inputs, scalars):
    """A host (CPU fallback) node runs eagerly on concrete values."""
    op = node.op
    lo = node.scalar_lo
    return op.fn(inputs, scalars[lo : lo + op.n_scalars])
