"""Recording one lowered call: its signature, its recipe, and the node it adds to the pending graph.

A recipe is what one op signature records (its interned `Op` and how to make its output tensors);
it is made once per signature, from PyTorch's meta kernel (or the lowering's own meta rule), and
every later call with the same signature only walks its arguments and calls `emit`. In Strict and
Debug a top-level op whose inputs are concrete runs at once from the compile cache (`run_now`),
as the same cache entry a one-node DeferAndFuse flush of it would use.
"""
from __future__ import annotations

import weakref
from typing import Callable, NamedTuple

import torch

from . import cache, device_dtypes, dtypes, pending, rng, views
from .events import METRICS
from .graph import OUT_BITS, Op
from .lowered_op import make_lowered_op
from .interned import FUNCS, func_id
from .lowering import LOWERINGS
from .meta import T, ArgSpec, Placeholder, flatten_outputs, meta_args, run_meta, template, unflatten_outputs
from .precision import XLA_NAMES
from .probe import cpu_error_instead, cpu_meta_instead, needs_cpu_probe, run_cpu_probe
from .tensor import Storage, layout_id, new_tensor, phys_layout

aten = torch.ops.aten

RECIPES: dict[tuple, "Recipe"] = {}
# a contraction's recipes, per float32 matmul precision (routes.lowered.route_contracting)
CONTRACTIONS: dict[str, dict[tuple, "Recipe"]] = {p: {} for p in XLA_NAMES}


class Router:
    """What the router (dispatch.py, a layer above) plugs in at import: `classify(info, func)`
    sets an overload's route (and `variant`, for a mutating one) when it is first seen."""

    classify: Callable | None = None


ROUTER = Router()


class Call:
    """The state of the ATen call being served, shared by the router and the recording path."""

    __slots__ = ("depth", "in_op", "eager_now")

    def __init__(self):
        self.depth = 0  # nesting: 1 for the user's op, more for the ops a route runs for it
        self.in_op = 0  # top-level calls in progress (more than one when an executor's check makes a call)
        self.eager_now = False  # Strict/Debug: a top-level op with concrete inputs runs at once


CALL = Call()


class FuncInfo:
    """Per-overload dispatch state, stored on the OpOverload itself (`func._df`): an attribute
    read is several times cheaper than hashing an OpOverload, whose __hash__ is Python."""

    __slots__ = ("route", "spec", "fid", "whole", "whole_n", "variant")

    def __init__(self, func):
        self.fid = func_id(func)
        self.spec = None
        self.route = None
        self.variant = None  # how a mutating overload maps to its functional op (variants.py)
        # Recipes of a lowered op called with one or two whole tpu tensors and nothing else
        # (`x + y`, `x.relu()`, which pass no scalars, lists or keywords), under the tensors'
        # layout ids (a lid, or a pair of them); `whole_n` of the schema's first arguments are tensors
        self.whole: dict = {}
        self.whole_n = 0


def info_of(func) -> FuncInfo:
    try:
        return func._df
    except AttributeError:
        info = FuncInfo(func)
        ROUTER.classify(info, func)
        func._df = info  # only once it has its route: an interrupt in `classify` left it None for good
        return info


_INDEX_OPS = (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._unsafe_index.Tensor,
              aten._unsafe_index_put.default)


def spec_of(func) -> ArgSpec:
    info = info_of(func)
    spec = info.spec
    if spec is None:
        low = LOWERINGS.get(func)
        if low is None and info.variant is not None:
            # a mutating op is keyed as its functional variant is: a learning rate that the
            # functional op takes at runtime must not make each in-place call a new signature
            low = LOWERINGS.get(info.variant.functional)
        spec = info.spec = ArgSpec(func, info.fid, low.static if low else (), func in _INDEX_OPS,
                                   low.runtime if low else ())
        info.whole_n = 2 if spec.pos[:2] == [T, T] else 1 if spec.pos[:1] == [T] else 0
    return spec


class OutInfo(NamedTuple):
    """One output of a recipe: the tensor to make, and where its value sits physically."""
    size: tuple
    stride: tuple
    dtype: torch.dtype
    lid: int  # layout id of (size, stride, dtype)
    phys: tuple  # the storage's physical shape
    lay: tuple | None  # read plan and offset when the tensor is not its storage read contiguously
    perm: object = None  # logical-to-physical permutation, or "strided" (lowered_op.finalize)


class Recipe(NamedTuple):
    """What one op signature records: its Op and how to make its output tensors."""
    op: Op
    outs: list  # of OutInfo
    spec_out: object  # "t" for one tensor, else flatten_outputs' spec
    rng: bool  # the op draws random numbers: two key scalars follow its own


def _out_info(meta_leaves) -> list[OutInfo]:
    outs = []
    for m in meta_leaves:
        if m.layout != torch.strided:  # run at once, where fallback.run_now refuses it
            raise NotImplementedError(f"a {m.layout} output")
        size, stride, dtype = tuple(m.shape), tuple(m.stride()), m.dtype
        phys, perm = phys_layout(size, stride)
        lay = None if perm is None else (views.plan_view(phys, size, stride, 0), 0)
        outs.append(OutInfo(size, stride, dtype, layout_id(size, stride, dtype), phys, lay, perm))
    return outs


def make_recipe(func, spec, key, args, kwargs, low=None, host=False, precision=None) -> Recipe:
    low = low if low is not None else LOWERINGS.get(func)
    if needs_cpu_probe(func, low, args, kwargs):
        run_cpu_probe(func, args, kwargs)
    metas = (None, None)
    try:
        if low is not None and (low.meta is not None or low.ctx):
            metas = meta_args(args, kwargs)
        if low is not None and low.meta is not None:
            meta_out = low.meta(*metas)
        else:
            meta_out = run_meta(func, args, kwargs)
    except Exception as err:  # noqa: BLE001 - CPU's error for the call, if it has one
        if host or isinstance(err, NotImplementedError):
            raise
        if low is None or low.family != "elementwise" or low.meta is not None:
            cpu_error_instead(func, args, kwargs, err)
        meta_out = cpu_meta_instead(func, args, kwargs, err)
    leaves, spec_out = flatten_outputs(meta_out)
    if low is not None and low.meta_fix is not None:
        leaves = low.meta_fix(args, kwargs, leaves)
    for m in leaves:  # a result the device cannot hold (complex128 on a TPU) is refused before it is recorded
        device_dtypes.check(m.dtype, str(func))
    outs = _out_info(leaves)
    tmpl = template(spec, args, kwargs)
    n_scalars = sum(1 for _ in _iter_placeholders(tmpl, (Placeholder.SCALAR, Placeholder.CPU_SCALAR)))
    # the signature key holds each input's layout, so a lowering may read strides off ctx.meta_args
    ctx_metas = metas if low is not None and low.ctx else (None, None)
    # the default dtype decides the outputs of factories and int-to-float promotions; a
    # contraction's precision, what its program computes
    op_key = (("host", key) if host else key, torch.get_default_dtype())
    op = Op.intern(
        op_key if precision is None else (*op_key, precision),
        lambda: make_lowered_op(func, key, low, tmpl, outs, n_scalars, spec, host=host, meta_inputs=ctx_metas,
                                precision=precision),
    )
    return Recipe(op, outs, spec_out, bool(low is not None and low.rng))


def _iter_placeholders(obj, kinds):
    if isinstance(obj, Placeholder):
        if obj.kind in kinds:
            yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _iter_placeholders(x, kinds)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _iter_placeholders(x, kinds)


_weakref = weakref.ref
_METRICS = METRICS
_PENDING = pending.PENDING
_record = pending.record


def emit(r: Recipe, tensors, scalars, key=None):
    """Record one node and return its outputs as tpu tensors (the recording hot path). `key`: a
    random op's (seed, counter) when the caller drew it (`rng.key_for`: its generator's)."""
    if r.rng:
        scalars.extend(key or rng.next_key())
    op = r.op
    g = _PENDING.graph
    call = CALL
    if call.eager_now and call.depth == 1 and not g.nodes:
        out = run_now(r, op, tensors, scalars)
        if out is not None:
            return out
    g, base = _record(op, tensors, scalars)
    if r.spec_out == "t":  # one tensor out, most ops
        size, stride, dtype, lid, phys, lay, _ = r.outs[0]
        st = Storage(None, phys, dtype, g, base)
        g.storages.append(_weakref(st))
        return new_tensor(st, size, stride, dtype, lid, lay)
    out = []
    track = g.storages.append
    for k, (size, stride, dtype, lid, phys, lay, _) in enumerate(r.outs):
        st = Storage(None, phys, dtype, g, base | k)
        track(_weakref(st))
        out.append(new_tensor(st, size, stride, dtype, lid, lay))
    return unflatten_outputs(out, r.spec_out)


def run_now(r: Recipe, op, tensors, scalars):
    """Strict's fast path: a top-level op whose inputs are all concrete runs straight from the
    compile cache, skipping the pending graph. The key is the one a flush of the op alone would
    build, its view inputs' reads included (`pending.tensor_ref`), so this is the same cache entry
    a DeferAndFuse flush of the same op uses. None when the op must go through a flush (an input
    pending, no entry yet)."""
    arrays = []
    refs = []
    avals = []
    seen: dict[int, int] = {}
    sig = []  # the reads of view inputs, nodes ahead of the op's as a flush records them
    read_at: dict = {}
    read_scalars = []
    for t in tensors:
        st = t._st
        v = st.value
        if v is None:
            return None
        pos = seen.get(id(v))
        if pos is None:
            pos = seen[id(v)] = len(arrays)
            arrays.append(v)
            avals.append((st.shape, st.dtype))
        lay = t._lay
        if lay is None:
            refs.append(-(pos + 1))
            continue
        ref = read_at.get((pos, lay))
        if ref is None:
            read, read_scs = pending.read_op(lay, t._lid)
            ref = read_at[(pos, lay)] = len(sig) << OUT_BITS
            sig.append((read.id, (-(pos + 1),)))
            if read_scs:
                read_scalars.extend(read_scs)
        refs.append(ref)
    n_out = len(r.outs)
    base = len(sig) << OUT_BITS
    sig.append((op.id, tuple(refs)))
    plan = cache.lookup(cache.Key.of(sig, tuple(base | k for k in range(n_out)), tuple(avals)))
    if plan is None:
        return None
    values = cache.run_one(plan, arrays, read_scalars + scalars if read_scalars else scalars, n_out, len(sig))
    out = []
    for k, (size, stride, dtype, lid, phys, lay, _) in enumerate(r.outs):
        out.append(new_tensor(Storage(values[k], phys, dtype), size, stride, dtype, lid, lay))
    if r.spec_out == "t":
        return out[0]
    return unflatten_outputs(out, r.spec_out)


def forget_recipes() -> None:
    """Drop every cached recipe (the default dtype changed what some calls make)."""
    RECIPES.clear()
    for recipes in CONTRACTIONS.values():
        recipes.clear()
    for func in FUNCS:
        func._df.whole = {}


dtypes.on_default_dtype_change(forget_recipes)
