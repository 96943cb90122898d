"""Route every ATen call on "tpu" tensors to the way deferfuse serves it.

Routes, tried in this order when an overload is first seen (the choice is cached per overload):

1. special: host transfers, copies, uninitialised memory, scalar reads (`special.py`);
2. lowered: a lowering in the table; the call is recorded as one node;
3. view: the output aliases an input; only metadata is created, nothing is computed;
4. in-place view (`unsqueeze_`, `t_`, ...): the tensor's own metadata changes;
5. data-dependent output shape (`nonzero`, `masked_select`, ...): flush, then run eagerly;
6. mutating (in-place and out= variants): the functional op, then a write into the target
   (`mutation.py`);
7. a PyTorch decomposition, a CompositeImplicitAutograd kernel, or a CompositeExplicitAutograd
   kernel: re-enter the dispatcher with smaller ops, once per signature where the expansion is a
   pure function of the call's tensors, which later calls replay as one node (`expansion.py`);
8. the CPU fallback: counted, warned once per op, or an error naming the op.
"""
from __future__ import annotations

import sys
import time
import weakref
from typing import Callable

import torch
from torch._decomp import core_aten_decompositions, decomposition_table

from . import backward, cache, engine, events, expansion, interrupts, lanes, modes, mutation, rng, sources, special, tensor
from .config import CONFIG
from .events import METRICS
from .graph import Op
from .lowering import LOWERINGS, fallback, make_lowered_op
from .meta import (T, ArgSpec, cpu_error_instead, flatten_outputs, meta_args, needs_cpu_probe, run_cpu_probe, run_meta,
                   signature, template, unflatten_outputs)
from .tensor import LAYOUTS, Storage, TpuTensor, layout_id, new_tensor, offset_of, phys_layout
from . import views

aten = torch.ops.aten

_FUNC_IDS: list = []  # fid -> func
_RECIPES: dict[tuple, "Recipe"] = {}
_VIEWS: dict[tuple, tuple] = {}
_depth = 0
_in_op = 0  # top-level calls in progress (one, or more when an executor's check makes a call)

# PyTorch's Core ATen decompositions, plus its other ATen-level ones. Reference implementations
# from torch._refs outside the core set are left out: they lower to prims, some of which come back
# to the very op being decomposed.
DECOMPOSITIONS = dict(core_aten_decompositions())
for _op, _fn in decomposition_table.items():
    if getattr(_fn, "__module__", "") == "torch._decomp.decompositions":
        DECOMPOSITIONS.setdefault(_op, _fn)
_DECOMPOSING: set = set()


class FuncInfo:
    """Per-overload dispatch state, stored on the OpOverload itself (`func._df`): an attribute
    read is several times cheaper than hashing an OpOverload, whose __hash__ is Python."""

    __slots__ = ("route", "spec", "fid", "whole", "whole_n")

    def __init__(self, func):
        self.fid = len(_FUNC_IDS)
        _FUNC_IDS.append(func)
        self.spec = None
        self.route = None
        # Recipes of a lowered op called with one or two whole tpu tensors and nothing else
        # (`x + y`, `x.relu()`; a fifth to a quarter of the lowered calls in bench's MLP and GPT
        # steps, which pass scalars, lists or keywords to the rest), under the tensors' layout
        # ids (a lid, or a pair of them); `whole_n` of the schema's first arguments are tensors
        self.whole: dict = {}
        self.whole_n = 0


def info_of(func) -> FuncInfo:
    try:
        return func._df
    except AttributeError:
        info = FuncInfo(func)
        func._df = info
        info.route = _classify(func)
        if info.route in (route_lowered, mutation.route_mutating) and lanes.splittable(func):
            info.route = lanes.split_route(func, info.route, _EAGER_NOW)
        return info


def dispatch(func, args: tuple, kwargs: dict):
    """Serve one ATen call from inside deferfuse (factories, composite helpers)."""
    return torch_dispatch(None, func, None, args, kwargs)


def torch_dispatch(cls, func, types, args=(), kwargs=None):
    """`TpuTensor.__torch_dispatch__` itself, installed at import (not a method that calls it):
    every ATen call on a tpu tensor comes here, and a Python frame is a tenth of a
    microsecond of the recording cost per op."""
    global _depth, _in_op
    if kwargs is None:
        kwargs = {}
    try:
        route = func._df.route
    except AttributeError:
        route = info_of(func).route
    if _depth:
        _depth += 1
        try:
            return route(func, args, kwargs)
        finally:
            _depth -= 1
    _in_op += 1  # Ctrl-C waits from here until the op, its checks and flush included, is done
    try:
        ex = _stack[-1] if _stack else _default[0]
        if ex.checks_before:
            ex.before_op(func, args, kwargs)
        if _SOURCE_LINES and route is not route_view and route is not route_alias:  # views record nothing
            f = _getframe(1)  # the user's own frame when the op is on their line, the common case
            code = f.f_code
            if _is_internal.get(id(code)) is False:
                _STATE.where = (code, f.f_lasti)
            else:
                _STATE.where = _user_frame_of(f) or _user_frame(2)
        timing = _TIMING[0]  # the report is on: time spent recording, excluding flushes
        _EAGER_NOW[0] = ex.runs_eagerly and not timing
        if timing:
            m = METRICS
            t0 = time.perf_counter()
            f0, w0 = m.flush_seconds, m.sync_wait_seconds
        _depth = 1
        try:
            out = route(func, args, kwargs)
        finally:
            _depth = 0
        ex.after_op(func, out)
        if timing:
            m.record_seconds += (time.perf_counter() - t0) - (m.flush_seconds - f0) - (m.sync_wait_seconds - w0)
    except BaseException as err:
        _in_op -= 1
        if _into_engine():  # raised into the autograd engine's C++, it would abort the process
            return _stop(err)
        raise
    _in_op -= 1
    if _HELD[0]:  # Ctrl-C came while the op ran: now that it is done (interrupts.py)
        _deliver()
    return out


def spec_of(func) -> ArgSpec:
    info = info_of(func)
    spec = info.spec
    if spec is None:
        low = LOWERINGS.get(func)
        if low is None and func in mutation._FUNCTIONAL:
            # an in-place op is keyed as its functional variant is: a learning rate that the
            # functional op takes at runtime must not make each in-place call a new signature
            low = LOWERINGS.get(mutation._FUNCTIONAL[func][1])
        allow_cpu = func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                             aten._unsafe_index.Tensor, aten._unsafe_index_put.default)
        spec = info.spec = ArgSpec(func, info.fid, low.static if low else (), allow_cpu,
                                   low.runtime if low else ())
        info.whole_n = 2 if spec.pos[:2] == [T, T] else 1 if spec.pos[:1] == [T] else 0
    return spec


# --- lowered ops -------------------------------------------------------------------------------


class Recipe:
    """What one op signature records: its Op and how to make its output tensors."""

    __slots__ = ("op", "outs", "spec_out", "rng")

    def __init__(self, op, outs, spec_out, rng_op):
        self.op = op
        self.outs = outs  # per output: (size, stride, dtype, lid, phys, lay)
        self.spec_out = spec_out
        self.rng = rng_op


def _out_info(meta_leaves) -> list:
    outs = []
    for m in meta_leaves:
        if m.layout != torch.strided:  # run at once, where fallback.run_now refuses it
            raise NotImplementedError(f"a {m.layout} output")
        size, stride, dtype = tuple(m.shape), tuple(m.stride()), m.dtype
        phys, perm = phys_layout(size, stride)
        lay = None if perm is None else (views.plan_view(phys, size, stride, 0), 0)
        outs.append((size, stride, dtype, layout_id(size, stride, dtype), phys, lay, perm))
    return outs


def _make_recipe(func, spec, key, args, kwargs, low=None, host=False) -> Recipe:
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
        cpu_error_instead(func, args, kwargs, err)
    leaves, spec_out = flatten_outputs(meta_out)
    if low is not None and low.meta_fix is not None:
        leaves = low.meta_fix(args, kwargs, leaves)
    outs = _out_info(leaves)
    tmpl = template(spec, args, kwargs)
    n_scalars = sum(1 for _ in _iter_placeholders(tmpl, ("s", "c")))
    # the signature key holds each input's layout, so a lowering may read strides off ctx.meta_args
    ctx_metas = metas if low is not None and low.ctx else (None, None)
    op = Op.intern(
        # the default dtype decides the outputs of factories and int-to-float promotions
        (("host", key) if host else key, torch.get_default_dtype()),
        lambda: make_lowered_op(func, key, low, tmpl, outs, n_scalars, spec, host=host, meta_inputs=ctx_metas),
    )
    return Recipe(op, [o[:6] for o in outs], spec_out, bool(low is not None and low.rng))


def _iter_placeholders(obj, kinds):
    from .meta import Placeholder

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
_STREAM = engine.STREAM
_STATE = engine.STREAM  # .where: the user's line of the top-level op being recorded
_record = engine.record
_stack = modes._stack
_default = modes._default
_SOURCE_LINES = CONFIG.source_lines
_user_frame = sources.user_frame
_user_frame_of = sources.user_frame_of  # the common case of user_frame, one call less per op
_is_internal = sources._is_internal
_getframe = sys._getframe
_TIMING = events.TIMING
_into_engine = backward.into_engine
_stop = backward.stop
_HELD = interrupts._held
_deliver = interrupts.deliver
interrupts.when_busy(lambda: _in_op > 0)


def emit(r: Recipe, tensors, scalars, key=None):
    """Record one node and return its outputs as tpu tensors (the recording hot path). `key`: a
    random op's (seed, counter) when the caller drew it (`rng.key_for`: its generator's)."""
    if r.rng:
        scalars.extend(key or rng.next_key())
    op = r.op
    g = _STREAM.graph
    if _EAGER_NOW[0] and _depth == 1 and not g.nodes:
        out = _run_now(r, op, tensors, scalars)
        if out is not None:
            return out
    g, base = _record(op, tensors, scalars)
    if r.spec_out == "t":  # one tensor out, most ops
        size, stride, dtype, lid, phys, lay = r.outs[0]
        st = Storage(None, phys, dtype, g, base)
        g.storages.append(_weakref(st))
        return new_tensor(st, size, stride, dtype, lid, lay)
    out = []
    track = g.storages.append
    for k, (size, stride, dtype, lid, phys, lay) in enumerate(r.outs):
        st = Storage(None, phys, dtype, g, base | k)
        track(_weakref(st))
        out.append(new_tensor(st, size, stride, dtype, lid, lay))
    return unflatten_outputs(out, r.spec_out)


# Strict's fast path: a top-level op whose inputs are all concrete, whole tensors runs straight
# from the compile cache, skipping the pending graph. The key is the one a one-node flush would
# build, so this is the same cache entry a DeferAndFuse flush of the same op uses.
_EAGER_NOW = [False]


def _run_now(r: Recipe, op, tensors, scalars):
    arrays = []
    refs = []
    avals = []
    seen: dict[int, int] = {}
    for t in tensors:
        st = t._st
        v = st.value
        if v is None or t._lay is not None:
            return None
        pos = seen.get(id(v))
        if pos is None:
            pos = seen[id(v)] = len(arrays)
            arrays.append(v)
            avals.append((st.shape, st.dtype))
        refs.append(-(pos + 1))
    n_out = len(r.outs)
    key = cache.Key.of([(op.id, tuple(refs))], tuple(range(n_out)), tuple(avals))
    plan = cache.lookup(key)
    if plan is None:
        return None
    single = plan.single
    ran = single.compiled
    values = single(arrays, scalars)
    engine.track_inflight(values)
    m = _METRICS
    m.ops_recorded += 1
    if single.compiled != ran:  # the plan's flush ran a donating variant; this one compiled now
        m.cache_misses += 1
    else:
        m.cache_hits += 1
    m.execute_calls += 1
    m.flushes["strict_op"] += 1
    m.nodes_flushed += 1
    m.outputs_materialized += n_out
    out = []
    for k, (size, stride, dtype, lid, phys, lay) in enumerate(r.outs):
        out.append(new_tensor(Storage(values[k], phys, dtype), size, stride, dtype, lid, lay))
    if r.spec_out == "t":
        return out[0]
    return unflatten_outputs(out, r.spec_out)


def forget_recipes() -> None:
    """Drop every cached recipe (the default dtype changed what some calls make)."""
    _RECIPES.clear()
    for func in _FUNC_IDS:
        info = func._df
        info.whole = {}


def route_lowered(func, args, kwargs):
    info = func._df
    n = len(args)
    if n <= info.whole_n and not kwargs:
        # the signature walk's key for such a call is (fid, n, the tensors' layout ids): the
        # recipe it found is kept under the ids alone
        r = None
        if n == 2:
            a, b = args
            if type(a) is TpuTensor and type(b) is TpuTensor:
                r = info.whole.get((a._lid, b._lid))
        elif n == 1 and type(args[0]) is TpuTensor:
            r = info.whole.get(args[0]._lid)
        if r is not None:
            return emit(r, [*args], [], rng.next_key() if r.rng else None)
    spec = info.spec or spec_of(func)
    key, tensors, scalars = signature(spec, args, kwargs)
    r = _RECIPES.get(key)
    if r is None:
        low = LOWERINGS[func]
        if low.supports is not None and not low.supports(*meta_args(args, kwargs)):
            if func in DECOMPOSITIONS:  # PyTorch's own expansion before the CPU
                return route_decomposed(func, args, kwargs)
            return fallback.run(func, args, kwargs, reason="unsupported arguments")
        r = _RECIPES[key] = _make_recipe(func, spec, key, args, kwargs, low)
    if 0 < n <= info.whole_n and not kwargs and all(type(a) is TpuTensor for a in args):
        info.whole[key[2] if n == 1 else key[2:4]] = r
    return emit(r, tensors, scalars, rng.key_for(kwargs) if r.rng else None)


# --- views -----------------------------------------------------------------------------------


def route_view(func, args, kwargs):
    # What each output is (size, stride, dtype, layout id, read plan) depends only on the op, its
    # static arguments, the base's layout and where the base sits in its storage: worked out once,
    # then found under a key made straight from the arguments when they are ints and int lists
    # (every view a model makes per step), without the general signature walk.
    base = args[0]
    vkey = made = None
    if not kwargs and type(base) is TpuTensor:
        lay = base._lay
        vkey = [func._df.fid, base._lid, base._st.shape, 0 if lay is None else lay[1]]
        for a in args[1:]:
            ta = type(a)
            if ta is int or a is None:
                vkey.append(a)
            elif ta is list and all(type(x) is int for x in a):
                vkey.append(tuple(a))
            else:
                vkey = None
                break
        if vkey is not None:
            vkey = tuple(vkey)
            made = _VIEW_OUTS.get(vkey)
    if made is None:
        base, made = _view_outputs(func, args, kwargs, vkey)
        if made is None:
            return _copying_view(func, args, kwargs)
    if base.is_inference() and not _inference_mode_on():
        # a view of an inference tensor is one too, as on CPU, so that writing through it
        # outside inference_mode raises; made outside the mode, it would pass for a normal tensor
        with torch.inference_mode():
            return _new_views(base._st, made)
    return _new_views(base._st, made)


def _new_views(st: Storage, made: tuple):
    res = [new_tensor(st, size, stride, dtype, lid, vlay) for size, stride, dtype, lid, vlay in made[0]]
    return res[0] if made[1] == "t" else unflatten_outputs(res, made[1])


_inference_mode_on = torch.is_inference_mode_enabled


def _view_outputs(func, args, kwargs, vkey):
    """(base, outputs) of a view not seen before under `vkey` (or any view whose arguments make
    no direct key); outputs None for a view that reinterprets the dtype."""
    spec = func._df.spec or spec_of(func)
    key, tensors, _ = signature(spec, args, kwargs)
    outs = _VIEWS.get(key)
    if outs is None:
        meta_out = run_meta(func, args, kwargs)
        leaves, spec_out = flatten_outputs(meta_out)
        outs = (
            [(tuple(m.shape), tuple(m.stride()), m.storage_offset(), m.dtype) for m in leaves],
            spec_out,
        )
        _VIEWS[key] = outs
    base = tensors[0]
    st = base._st
    off = offset_of(base)
    if vkey is None:
        vkey = (key, st.shape, off)
        made = _VIEW_OUTS.get(vkey)
        if made is not None:
            return base, made
    if any(o[3] != base.dtype for o in outs[0]):
        return base, None
    if len(_VIEW_OUTS) > 200_000:  # offsets that never repeat (a growing KV cache's views)
        _VIEW_OUTS.clear()
    made = _VIEW_OUTS[vkey] = (
        [(size, stride, dtype, layout_id(size, stride, dtype), tensor.layout_for(st, size, stride, off + delta))
         for size, stride, delta, dtype in outs[0]],
        outs[1],
    )
    return base, made


_VIEW_OUTS: dict[tuple, tuple] = {}


def route_alias(func, args, kwargs):
    """detach and alias: a new tensor over the same storage with the same layout. Autograd's
    AccumulateGrad detaches every parameter's gradient on every backward pass, so this skips
    the signature and caches a general view needs."""
    t = args[0]
    size, stride, dtype = LAYOUTS[t._lid]
    return new_tensor(t._st, size, stride, dtype, t._lid, t._lay)


def route_unsafe_view(func, args, kwargs):
    """_unsafe_view aliases its input on CPU (it is a view autograd does not track), and composite
    out= kernels rely on that: kron.out resizes `out`, takes an _unsafe_view of it and writes the
    product into the view. A contiguous input is therefore viewed; anything else is reshaped."""
    if args[0].is_contiguous():
        return dispatch(aten.view.default, args, kwargs)
    return route_lowered(func, args, kwargs)


def _copying_view(func, args, kwargs):
    """A view that reinterprets the dtype (view_as_real, view(dtype), .real): computed as a copy.
    Reads are exact; a write into the result would not reach the base, so it raises instead."""
    if func not in LOWERINGS:
        raise NotImplementedError(f"deferfuse: {func} reinterprets its input's dtype and has no lowering")
    if _SOURCE_LINES:  # reached from route_view, which skips the user's line: this one records a node
        _STATE.where = _user_frame(1)
    out = route_lowered(func, args, kwargs)
    for t in out if isinstance(out, (list, tuple)) else [out]:
        t._st.copy_of = str(func)
    return out


def route_as_strided(func, args, kwargs):
    base, size, stride = args[0], tuple(args[1]), tuple(args[2])
    off = args[3] if len(args) > 3 and args[3] is not None else kwargs.get("storage_offset")
    off = offset_of(base) if off is None else off
    _check_storage_bounds(base._st, size, stride, off)
    return tensor.view_of(base, size, stride, off)


def _check_storage_bounds(st: Storage, size, stride, off) -> None:
    if any(n == 0 for n in size):
        return
    need = off + 1 + sum((n - 1) * s for n, s in zip(size, stride))
    if need > st.numel:
        item = st.dtype.itemsize
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {off}, and itemsize {item} "
            f"requiring a storage size of {need * item} are out of bounds for storage of size {st.numel * item}"
        )


def route_inplace_view(func, args, kwargs):
    t = args[0]
    margs, mkwargs = meta_args(args, kwargs)
    with torch.utils._python_dispatch._disable_current_modes():
        m = func(*margs, **mkwargs)
    if isinstance(m, (list, tuple)):
        m = m[0]
    size, stride = tuple(m.shape), tuple(m.stride())
    off = m.storage_offset() + (0 if func is aten.as_strided_.default else offset_of(t))
    if func is aten.as_strided_.default:
        _check_storage_bounds(t._st, size, stride, off)
    set_metadata(t, size, stride, off)
    return t


def set_metadata(t: TpuTensor, size, stride, off) -> None:
    """Change a tpu tensor's own size/stride/offset (in-place views, resize_, set_).

    The wrapper's C++ storage is only a size bound (it holds no data), so when the new view needs
    a larger one, a storage of the right size is borrowed from a fresh wrapper and attached with
    the Meta kernel of `set_`, the one kernel that edits a TensorImpl of any device.
    """
    size, stride = tuple(size), tuple(stride)
    extent = off + 1 + sum((n - 1) * st for n, st in zip(size, stride)) if all(n > 0 for n in size) else off
    with torch._C._DisableTorchDispatch():
        if extent * t.dtype.itemsize <= _wrapper_storage(t).nbytes():
            aten.as_strided_.default(t, size, stride, off)
        else:
            donor = torch.Tensor._make_wrapper_subclass(TpuTensor, (extent,), dtype=t.dtype, device=tensor.DEVICE)
            aten.set_.source_Storage_storage_offset._op_dk(
                torch._C.DispatchKey.Meta, t, _wrapper_storage(donor), off, size, stride
            )
    t._lid = layout_id(size, stride, t.dtype)
    t._lay = tensor.layout_for(t._st, size, stride, off)


_wrapper_storage = torch.Tensor.untyped_storage  # the wrapper's own C++ storage, not the data_ptr facade


# --- everything else ---------------------------------------------------------------------------


def _expand(func, args, kwargs, how):
    """Run a decomposition/composite kernel (or replay its kept expansion, `expansion.py`); if it
    comes back to `func` itself, fall back."""
    def now():
        if func in _DECOMPOSING:
            return fallback.run(func, args, kwargs, reason="its decomposition re-enters it")
        _DECOMPOSING.add(func)
        try:
            return how(*args, **kwargs)
        finally:
            _DECOMPOSING.discard(func)

    return expansion.run(func, args, kwargs, now)


def route_decomposed(func, args, kwargs):
    return _expand(func, args, kwargs, DECOMPOSITIONS[func])


def route_composite(func, args, kwargs):
    return _expand(func, args, kwargs, func.decompose)


def route_explicit(func, args, kwargs):
    return _expand(func, args, kwargs,
                   lambda *a, **k: func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *a, **k))


def route_fallback(func, args, kwargs):
    return fallback.run(func, args, kwargs)


def _has_kernel(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    except RuntimeError:  # an op defined only in Python (no dispatcher entry by that name)
        return False


def _classify(func) -> Callable:
    route = _classify_plain(func)
    twin = special.SCALAR_TWINS.get(func)
    if twin is not None:
        route = special.scalar_twin(*twin, route)
    pos = special.FILL_VALUES.get(func)
    if pos is not None:
        route = special.checked_fill(pos, route)
    keyword = special.CAST_KEYWORDS.get(func)
    if keyword is not None:
        route = special.cast_keyword(keyword, route)
    name = func.__name__.split(".")[0]
    if (name.endswith("_like") or name.startswith("new_")) and any(a.name == "device" for a in func._schema.arguments):
        route = special.elsewhere(route)
    return route


def _classify_plain(func) -> Callable:
    sp = special.HANDLERS.get(func)
    if sp is not None:
        return sp
    if func is aten._unsafe_view.default:
        return route_unsafe_view
    if func is aten.detach.default or func is aten.alias.default:
        return route_alias
    if func in LOWERINGS:
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return _copying_view  # a view deferfuse cannot alias (dtype reinterpretation)
        return route_lowered
    if func is aten.as_strided.default:
        return route_as_strided
    schema = func._schema
    tags = func.tags
    name = func.name()
    if _has_kernel(name, "CompositeImplicitAutograd") and func not in DECOMPOSITIONS:
        return route_composite
    if torch.Tag.inplace_view in tags:
        return route_inplace_view
    returns = schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return route_view
    if len(returns) == 1 and str(returns[0].type) == "List[Tensor]" and returns[0].alias_info is not None \
            and not returns[0].alias_info.is_write:
        return route_view
    if torch.Tag.dynamic_output_shape in tags and func not in DECOMPOSITIONS:
        return special.route_data_dependent
    if schema.is_mutable:
        kind = mutation.functional_variant(func)
        if kind is not None:
            mutation._FUNCTIONAL[func] = kind
            return mutation.route_mutating
    if func in DECOMPOSITIONS:
        return route_decomposed
    if _has_kernel(name, "CompositeImplicitAutograd"):
        return route_composite
    if _has_kernel(name, "CompositeExplicitAutograd"):
        return route_explicit
    return route_fallback


TpuTensor.__torch_dispatch__ = classmethod(torch_dispatch)
