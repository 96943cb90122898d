"""Decompositions expanded once per signature, then recorded as one node.

An op without a lowering of its own (mse_loss and its backward, and whatever else PyTorch's
decomposition table or a Composite kernel serves) is expanded into smaller ops that re-enter the
dispatcher. Doing that on every call costs the decomposition's Python (dtype promotion, pytree
maps) plus one dispatch per smaller op: mse_loss is seven dispatches, called every step of a
training loop. What the smaller ops record depends only on the call's signature (tensor layouts
and static arguments) as long as the expansion is a pure function of the call's
tensors, so the first expansion's nodes are kept as one composite Op and later calls with the
same signature record that single node.

An expansion is kept only when it provably is such a function:
- the call has tensors and no runtime scalars (a scalar's value would be baked into the Op);
- nothing was flushed and nothing fell back to CPU while it recorded (a host read or a fallback
  makes the result depend on values), and it drew no random numbers (the key would be baked in);
- every recorded node reads only the call's tensors or earlier nodes of the expansion, and no
  node is a host step;
- no input's storage was written (a decomposition updating an argument in place);
- every output is a whole, fresh value made by the expansion, each in its own storage (an output
  that aliases an input or another output must stay a view).
A kept expansion with contractions inside (_addmm_activation's addmm) holds their float32 matmul
precision; a call under another setting expands again and keeps that setting's composite instead.
Anything else is remembered per signature and expanded on every call, as before.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch._decomp import core_aten_decompositions, decomposition_table

from .. import dtypes, pending, program, rng
from ..events import METRICS
from ..graph import OUT_BITS, Op, node_of, out_of
from ..meta import flatten_outputs, signature
from ..precision import current as matmul_precision
from ..probe import run_cpu_probe
from ..record import OutInfo, Recipe, emit, spec_of
from ..tensor import TpuTensor
from . import fallback

aten = torch.ops.aten

# PyTorch's Core ATen decompositions, plus its other ATen-level ones. Reference implementations
# from torch._refs outside the core set are left out: they lower to prims, some of which come back
# to the very op being decomposed.
DECOMPOSITIONS = dict(core_aten_decompositions())
for _op, _fn in decomposition_table.items():
    if getattr(_fn, "__module__", "") == "torch._decomp.decompositions":
        DECOMPOSITIONS.setdefault(_op, _fn)
_DECOMPOSING: set = set()

# signature -> Recipe of the composite op, or None: this signature always expands
_KEPT: dict = {}
dtypes.on_default_dtype_change(_KEPT.clear)
_MISSING = object()
# a signature that always expands, whose first call took its tensors' graph inputs first: every
# call does, so each records the first call's graph (inputs in the same order)
_REFS_FIRST = object()


def run(func, args: tuple, kwargs: dict, expand: Callable):
    """Serve a decomposed call: replay its kept composite if any, else expand (and maybe keep)."""
    try:
        key, tensors, scalars = signature(func._df.spec or spec_of(func), args, kwargs)
    except Exception:  # noqa: BLE001 - arguments the signature walk does not model: just expand
        return expand()
    r = _KEPT.get(key, _MISSING)
    if r is None:
        return expand()
    if r is _REFS_FIRST:
        g = pending.PENDING.graph
        before = g.mark()
        for t in tensors:
            pending.tensor_ref(g, t)
        n0 = len(g.nodes)
        out = expand()
        _drop_refs(g, before, n0, tensors)
        return out
    if r is not _MISSING and r.op.precision is not None and r.op.precision != matmul_precision():
        r = _MISSING  # its contractions were traced at another precision: expand and keep anew
    if r is not _MISSING:
        METRICS.decompositions_replayed[r.op.name] += 1
        return emit(r, tensors, scalars)
    if scalars or not tensors:
        _KEPT[key] = None
        return expand()
    if len(_KEPT) > 100_000:  # signatures that never repeat: stop learning rather than grow
        return expand()
    return _learn(str(func), key, tensors, expand)


_RECORDED_AGAIN = RuntimeError("deferfuse internal error: a value of an expansion that was recorded again as one node")


def _learn(name: str, key, tensors, expand: Callable):
    """Expand, and keep the composite if the expansion allows (the module's docstring). A kept
    composite replaces the nodes the expansion recorded at once: the first call records what
    every later call does, so a training loop's first step is the same program as the next."""
    g = pending.PENDING.graph
    before = g.mark()
    in_refs = [pending.tensor_ref(g, t) for t in tensors]
    mark = g.mark()
    n0 = mark[0]  # the expansion's first node
    inputs_before = [(t._st, t._st.value, t._st.graph, t._st.ref) for t in tensors]
    rng_before = rng._counter
    fallbacks_before = sum(METRICS.cpu_fallbacks.values())
    out = expand()
    kept = None
    if (
        pending.PENDING.graph is g
        and len(in_refs) == len(set(in_refs))
        and rng._counter == rng_before
        and sum(METRICS.cpu_fallbacks.values()) == fallbacks_before
        and all(st.value is v and st.graph is gr and st.ref == ref for st, v, gr, ref in inputs_before)
    ):
        kept = _composite(name, key, g, n0, in_refs, out)
    _drop_refs(g, before, n0, tensors)
    _KEPT[key] = _REFS_FIRST if kept is None else kept
    if kept is not None and g.roll_back(mark, _RECORDED_AGAIN):
        return emit(kept, tensors, [])
    return out


def _drop_refs(g, before: tuple, n0: int, tensors) -> None:
    """An expansion that recorded nothing (`empty_like`: metadata only) leaves what taking its
    arguments' refs recorded (the reads of views, graph inputs) dead: forget it, so that the op
    records nothing (a step replay runs such an op again as it is only if it does). Not where a
    storage came to hold one of those reads (no new storage; no argument's) or was made pending
    (an uninitialised argument's zeros); nor a captured step's inputs."""
    if pending.PENDING.graph is not g or len(g.nodes) != n0 or len(g.storages) != before[2] or g.sources is not None:
        return
    lo = before[0] << OUT_BITS
    if all(t._st.graph is not g or t._st.ref < lo for t in tensors):
        g.forget_inputs(before[3])
        g.roll_back(before, _RECORDED_AGAIN)


def _composite(name: str, key, g, n0: int, in_refs: list, out):
    """The Recipe of one node that computes what g.nodes[n0:] computed, or None."""
    n1 = len(g.nodes)
    if n1 <= n0:
        return None
    lo_ref, hi_ref = n0 << OUT_BITS, n1 << OUT_BITS
    known = set(in_refs)
    for node in g.nodes[n0:n1]:
        if node.op.host:
            return None
        for r in node.inputs:
            if r not in known and not lo_ref <= r < hi_ref:
                return None
    leaves, spec_out = flatten_outputs(out)
    if not leaves:
        return None
    outs, out_refs, seen = [], [], set()
    for t in leaves:
        if type(t) is not TpuTensor or t._lay is not None:
            return None
        st = t._st
        if st.graph is not g or not lo_ref <= st.ref < hi_ref or id(st) in seen or st.copy_of is not None:
            return None
        seen.add(id(st))
        out_refs.append(st.ref)
        outs.append(OutInfo(tuple(t.shape), tuple(t.stride()), t.dtype, t._lid, st.shape, None))
    spec_out = _plain(spec_out)
    nodes = g.nodes
    scalar_ids = [i for n in nodes[n0:n1] for i in range(n.scalar_lo, n.scalar_lo + n.op.n_scalars)]
    consts = [g.scalars[i] for i in scalar_ids]
    inner = program.build(nodes, range(n0, n1), in_refs, out_refs, scalar_ids)
    out_avals = [nodes[node_of(r)].op.out_avals[out_of(r)] for r in out_refs]
    # the precision of the contractions inside (all recorded by this one call, so at one setting)
    precision = next((n.op.precision for n in nodes[n0:n1] if n.op.precision is not None), None)
    portable = all(n.op.portable for n in nodes[n0:n1])

    def make():
        def fn(ins, scs):
            return inner(ins, consts)

        return Op(("expanded", key, precision), name, fn, out_avals, 0, family="expanded", precision=precision,
                  portable=portable)

    op = Op.intern(("expanded", key, precision), make)
    return Recipe(op, outs, spec_out, False)


def _plain(spec):
    """A result spec with PyTorch's named return tuples (torch.return_types.*) made plain tuples:
    they are built from positional fields, and the binding above the dispatcher names them again."""
    if spec is None or spec == "t" or spec == "tlist" or spec[0] == "const":
        return spec
    typ, parts = spec
    return (tuple if issubclass(typ, tuple) else typ, [(lo, n, _plain(s)) for lo, n, s in parts])


def _expand(func, args, kwargs, how):
    """Run a decomposition/composite kernel (or replay its kept expansion, `run`); if it comes
    back to `func` itself, fall back."""
    def now():
        if func in _DECOMPOSING:
            return fallback.run(func, args, kwargs, reason="its decomposition re-enters it")
        _DECOMPOSING.add(func)
        try:
            return how(*args, **kwargs)
        except (RuntimeError, NotImplementedError):  # CPU's own type (LinAlgError, from the real values)
            raise
        except Exception as err:  # noqa: BLE001 - an inner op's check is worded its own way
            # (stack of a 2-dim and a 3-dim tensor: unsqueeze's IndexError, CPU's RuntimeError).
            # CPU's error over stand-ins replaces it only when of another type
            try:
                run_cpu_probe(func, args, kwargs, real_only=True)
            except Exception as cpu:  # noqa: BLE001
                if type(cpu) is not type(err):
                    raise cpu.with_traceback(None) from None
            raise
        finally:
            _DECOMPOSING.discard(func)

    return run(func, args, kwargs, now)


def route_decomposed(func, args, kwargs):
    return _expand(func, args, kwargs, DECOMPOSITIONS[func])


def route_composite(func, args, kwargs):
    return _expand(func, args, kwargs, func.decompose)


def route_explicit(func, args, kwargs):
    return _expand(func, args, kwargs,
                   lambda *a, **k: func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *a, **k))
