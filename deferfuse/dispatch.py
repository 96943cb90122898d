"""The router: every ATen call on "tpu" tensors comes here and goes to the route that serves it.

Routes, tried in this order when an overload is first seen (the choice is kept on the overload):

1. a route of its own (`HANDLERS`): host reads and copies, uninitialised memory and resizing,
   ops whose output shape or check depends on data (`routes/copies.py`, `routes/memory.py`,
   `routes/data_dependent.py`);
2. lowered: a lowering in the table; the call is recorded as one node (`routes/lowered.py`);
3. view: the output aliases an input; only metadata is made, nothing is computed; in-place views
   (`unsqueeze_`, `t_`) change the tensor's own metadata (`routes/views.py`);
4. data-dependent output shape (`nonzero`, `masked_select`, ...): flush, then run eagerly;
5. mutating (in-place and out= variants): the functional op, then a write into the target
   (`routes/mutation.py`);
6. a PyTorch decomposition, a CompositeImplicitAutograd kernel, or a CompositeExplicitAutograd
   kernel, expanded into smaller ops that come back here (`routes/expansion.py`);
7. the CPU fallback: counted, warned once per op, or an error naming the op (`routes/fallback.py`).

Some overloads then get a wrapper that checks or converts an argument as CPU does
(`routes/wrappers.py`), and foreach ops one that splits their lists at layer boundaries (`lanes.py`).
"""
from __future__ import annotations

import sys
import time
from typing import Callable

import torch

from . import backward, events, interrupts, lanes, modes, sources
from .config import CONFIG
from .events import METRICS
from .lowering import LOWERINGS
from .pending import PENDING
from .record import CALL, ROUTER, FuncInfo, info_of
from .routes import copies, data_dependent, memory, wrappers
from .routes.expansion import DECOMPOSITIONS, route_composite, route_decomposed, route_explicit
from .routes.fallback import route_fallback
from .routes.lowered import route_contracting, route_lowered
from .routes.mutation import route_mutating
from .routes.views import (copying_view, route_alias, route_as_strided, route_inplace_view, route_unsafe_view,
                           route_view)
from .tensor import TpuTensor
from .variants import functional_variant

aten = torch.ops.aten

HANDLERS = {
    aten._assert_async.default: data_dependent.route_assert_async,
    aten._assert_async.msg: data_dependent.route_assert_async,
    aten._local_scalar_dense.default: copies.route_local_scalar_dense,
    aten._to_copy.default: copies.route_to_copy,
    aten.copy_.default: copies.route_copy_,
    aten.to.dtype: copies.route_to_dtype,
    aten.empty.memory_format: memory.route_uninitialised,
    aten.empty_strided.default: memory.route_uninitialised,
    aten.new_empty.default: memory.route_uninitialised,
    aten.new_empty_strided.default: memory.route_uninitialised,
    aten.resize_.default: memory.route_resize_,
    aten.resize_as_.default: memory.route_resize_as_,
    aten._resize_output_.default: memory.route_resize_output_,
    aten.lift_fresh.default: memory.route_lift_fresh,
    aten.set_.source_Tensor: memory.route_set_source_tensor,
    aten.equal.default: data_dependent.route_equal,
    aten.index.Tensor: data_dependent.route_index,
    aten._unsafe_index.Tensor: data_dependent.route_index,
    aten.index_put.default: data_dependent.route_index_put,
    aten.index_put_.default: data_dependent.route_index_put,
    aten._unsafe_index_put.default: data_dependent.route_index_put,
    **{f: data_dependent.route_tensor_ends for f in data_dependent.TENSOR_ENDS},
}


def dispatch(func, args: tuple, kwargs: dict):
    """Serve one ATen call from inside deferfuse (factories, composite helpers)."""
    return torch_dispatch(None, func, None, args, kwargs)


def torch_dispatch(cls, func, types, args=(), kwargs=None):
    """`TpuTensor.__torch_dispatch__` itself, installed at import (not a method that calls it):
    every ATen call on a tpu tensor comes here, and a Python frame is a noticeable part of the
    recording cost per op."""
    if kwargs is None:
        kwargs = {}
    try:
        route = func._df.route
    except AttributeError:
        route = info_of(func).route
    call = _CALL
    if call.depth:
        call.depth += 1
        try:
            return route(func, args, kwargs)
        finally:
            call.depth -= 1
    call.in_op += 1  # signal handlers wait from here until the op, its checks and flush included, is done
    try:
        ex = _stack[-1] if _stack else _default[0]
        if ex.checks_before:
            ex.before_op(func, args, kwargs)
        if _SOURCE_LINES and route is not route_view and route is not route_alias:  # views record nothing
            f = _getframe(1)  # the user's own frame when the op is on their line, the common case
            code = f.f_code
            if _is_internal.get(id(code)) is False:
                _PENDING.where = (code, f.f_lasti)
            else:
                _PENDING.where = _user_frame_of(f) or _user_frame(2)
        timing = events.TIMING[0]  # the report is on: time spent recording, excluding flushes
        call.eager_now = ex.runs_eagerly and not timing
        if timing:
            m = METRICS
            t0 = time.perf_counter()
            f0, w0 = m.flush_seconds, m.sync_wait_seconds
        serve = ex.serve
        if serve is None:
            call.depth = 1
            try:
                out = route(func, args, kwargs)
            finally:
                call.depth = 0
            ex.after_op(func, out)
        else:  # DeferAndFuse replaying a step (executors/replay.py): it calls the route if need be
            out = serve(func, args, kwargs, route)
        if timing:
            m.record_seconds += (time.perf_counter() - t0) - (m.flush_seconds - f0) - (m.sync_wait_seconds - w0)
    except BaseException as err:
        call.in_op -= 1
        if _into_engine():  # raised into the autograd engine's C++, it would abort the process
            return _stop(err)
        if interrupts.held():  # a signal's handler waited through the op: its exception, err its context
            interrupts.deliver()
        raise
    call.in_op -= 1
    if interrupts.held():  # a signal came while the op ran: its handler runs now that it is done (interrupts.py)
        interrupts.deliver()
    return out


_CALL = CALL
_PENDING = PENDING
_stack = modes._stack
_default = modes._default
_SOURCE_LINES = CONFIG.source_lines
_user_frame = sources.user_frame
_user_frame_of = sources.user_frame_of  # the common case of user_frame, one call less per op
_is_internal = sources._is_internal
_getframe = sys._getframe
_into_engine = backward.into_engine
_stop = backward.stop
interrupts.when_busy(lambda: _CALL.in_op > 0)


# --- classification ---------------------------------------------------------------------------


def _has_kernel(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    except RuntimeError:  # an op defined only in Python (no dispatcher entry by that name)
        return False


def classify(info: FuncInfo, func) -> None:
    """Choose `func`'s route once, when it is first seen (`record.info_of` asks)."""
    route = _plain_route(func)
    if route is route_mutating:
        info.variant = functional_variant(func)
    twin = wrappers.SCALAR_TWINS.get(func)
    if twin is not None:
        route = wrappers.scalar_twin(*twin, route)
    pos = wrappers.FILL_VALUES.get(func)
    if pos is not None:
        route = wrappers.checked_fill(pos, route)
    keyword = wrappers.CAST_KEYWORDS.get(func)
    if keyword is not None:
        route = wrappers.cast_keyword(keyword, route)
    name = func.__name__.split(".")[0]
    if (name.endswith("_like") or name.startswith("new_")) and any(a.name == "device" for a in func._schema.arguments):
        route = wrappers.other_device(route)
    if (route is route_lowered or route is route_contracting or route is route_mutating) and lanes.splittable(func):
        route = lanes.split_route(func, route, _CALL)
    info.route = route


def _plain_route(func) -> Callable:
    sp = HANDLERS.get(func)
    if sp is not None:
        return sp
    if func is aten._unsafe_view.default:
        return route_unsafe_view
    if func is aten.detach.default or func is aten.alias.default:
        return route_alias
    if func in LOWERINGS:
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return copying_view  # a view deferfuse cannot alias (dtype reinterpretation)
        return route_contracting if LOWERINGS[func].precision else route_lowered
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
        return data_dependent.route_data_dependent
    if schema.is_mutable and functional_variant(func) is not None:
        return route_mutating
    if func in DECOMPOSITIONS:
        return route_decomposed
    if _has_kernel(name, "CompositeImplicitAutograd"):
        return route_composite
    if _has_kernel(name, "CompositeExplicitAutograd"):
        return route_explicit
    return route_fallback


ROUTER.classify = classify
TpuTensor.__torch_dispatch__ = classmethod(torch_dispatch)
