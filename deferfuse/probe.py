"""CPU rehearsals of a call: where CPU PyTorch's kernel refuses what the meta kernel lets
through (a dtype, a Python bool, a shape only CPU checks), the call is run once per signature on
CPU over stand-ins of its tensors, so that its error is CPU's own, raised at the user's line.
"""
from __future__ import annotations

import warnings

import torch

from .tensor import TpuTensor

aten = torch.ops.aten


def needs_cpu_probe(func, low, args, kwargs) -> bool:
    """Ops whose CPU kernel may reject what the meta kernel lets through, and whose result
    cannot depend on their inputs' shapes beyond broadcasting and valid dims: elementwise ones
    that are in-place (the result type must cast into the target), bitwise or shifts, and
    elementwise ops, reductions and softmaxes on integer or bool tensors (CPU has no integer
    std or softmax; deferfuse returned integer results), index ops given a floating index,
    random ops (their arguments' ranges) and nll_loss given class targets that are not int64;
    any op given or asked for bool (CPU has no bool matmul or arange), and reductions of nothing."""
    if low is None or low.probe is None or func.namespace != "aten":
        return False  # deferfuse's own ops (sdpa, linear, jax_op) have no CPU kernel to ask
    if kwargs.get("dtype") in _RARE_KERNELS or any(type(a) is TpuTensor and a.dtype is torch.bool or type(a) is complex
                                                   for a in args) or any(type(v) is complex for v in kwargs.values()):
        return True  # CPU has no bool matmul, no complex arange or xlogy (`xlogy(x, 1j)`), no complex
        # `value=` for a real addcmul
    if low.probe == "index":
        return _float_index_argument(func, args, kwargs) or _shape_probed(func, args) or (
            func in _SAME_DTYPE_SOURCE and isinstance(args[0], TpuTensor) and len(args) > 3
            and isinstance(args[3], torch.Tensor) and args[3].dtype != args[0].dtype)
    if low.probe == "reduction" and _has_empty(args):
        return True  # CPU refuses max() and argmax() of nothing (XLA has no identity to give)
    if low.probe == "random":  # their argument checks (from < to, p in [0, 1], std >= 0)
        return any(type(a) is TpuTensor for a in args)
    if func in CLASS_TARGETS:  # CPU wants int64 (or uint8) class targets
        return isinstance(args[1], TpuTensor) and args[1].dtype not in (torch.int64, torch.uint8)
    if (low.probe in ("elementwise", "reduction") or func in _SORTS) and any(
            type(a) is TpuTensor and a.dtype.is_complex for a in args):
        return True  # complex numbers have no order: CPU refuses lt, maximum, clamp, sort on them
    if func in _NO_BOOL and isinstance(args[0], TpuTensor) and args[0].dtype == torch.bool:
        return True  # CPU has no bool topk or kthvalue (CUDA has; the oracle is CPU)
    if low.probe == "elementwise":
        name = func._overloadpacket.__name__
        if name.endswith("_") or name.startswith(("bitwise_", "__")):
            return True
        if any(type(a) is bool for a in args) or any(type(a) is bool for a in kwargs.values()):
            return True  # a Python bool operand or alpha: CPU refuses `x - True`, the meta kernel does not
    elif low.probe != "reduction" and func not in _SOFTMAXES:
        return False
    for a in (*args, *kwargs.values()):
        if isinstance(a, TpuTensor) and not (a.dtype.is_floating_point or a.dtype.is_complex):
            return True
    return False


_SOFTMAXES = (aten._softmax.default, aten._log_softmax.default)
CLASS_TARGETS = (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)  # nll_loss's kernels
_NO_BOOL = (aten.topk.default, aten.kthvalue.default)
_SORTS = (aten.sort.default, aten.sort.stable, aten.topk.default, aten.argsort.default, aten.argsort.stable)
_INDEX_ARGUMENTS = ("index", "indices", "offsets")
# index ops whose CPU kernel wants `source` (argument 3) in self's dtype; their meta kernels do not check
_SAME_DTYPE_SOURCE = (aten.index_add.default, aten.index_add_.default, aten.index_copy.default,
                      aten.index_copy_.default)
# index ops whose meta kernels let through shapes CPU refuses (index_add's source, index_select's
# index of two dims, index_put's values): probed on CPU with stand-ins of the real shapes
SHAPE_PROBED = (aten.index_add.default, aten.index_add_.default, aten.index_select.default,
                aten.index_put.default, aten.index_put_.default, aten._unsafe_index_put.default)
_SHAPE_PROBE_NUMEL = 1 << 24  # a bigger target is not rehearsed on CPU (its wrong shape fails at the flush)


_RARE_KERNELS = (torch.bool, torch.complex64, torch.complex128)


def _has_empty(args) -> bool:
    return any(type(a) is TpuTensor and a.numel() == 0 for a in args)


def _shape_probed(func, args) -> bool:
    return func in SHAPE_PROBED and isinstance(args[0], TpuTensor) and args[0].numel() <= _SHAPE_PROBE_NUMEL


def _float_index_argument(func, args, kwargs) -> bool:
    """An index-family call with a floating index tensor (an index computed by a division):
    CPU rejects its dtype before anything else, and XLA would fail only at the flush. Valid
    calls are never probed, so the probe's stand-ins cannot trip on these ops' shape rules."""
    for i, a in enumerate(func._schema.arguments):
        if a.name in _INDEX_ARGUMENTS:
            v = args[i] if i < len(args) else kwargs.get(a.name)
            if isinstance(v, TpuTensor) and (v.dtype.is_floating_point or v.dtype.is_complex):
                return True
    return False


# integer divisions: CPU raises ZeroDivisionError for a zero number as divisor (`x // 0`). The
# rehearsal runs once per signature, and a number's value is not part of it, so `x // 2` then
# `x // 0` would skip it: these are rehearsed again whenever the number is 0
_DIVISIONS = {getattr(getattr(aten, n), o)
              for n in ("floor_divide", "floor_divide_", "remainder", "remainder_", "fmod", "fmod_", "div", "div_")
              for o in getattr(aten, n).overloads() if o in ("default", "Scalar", "Tensor", "Scalar_mode", "Tensor_mode")}


def divides_by_a_zero_number(func, args) -> bool:
    if func not in _DIVISIONS or len(args) < 2:
        return False
    b = args[1]
    if type(b) is torch.Tensor and b.dim() == 0 and not (b.dtype.is_floating_point or b.dtype.is_complex):
        b = b.item()  # a wrapped Python number
    return type(b) in (int, bool) and b == 0


def run_cpu_probe(func, args: tuple, kwargs: dict, real_only: bool = False) -> None:
    """Run an op on CPU over stand-ins with the same dtypes and the call's Python scalars: its
    dtype and scalar checks raise CPU's own errors at the user's line. Meta kernels skip them
    (bool subtraction, an integer to a negative power, integer division by zero, a float result
    written into an integer tensor, bitwise ops on floats, std of integers).

    The stand-ins are ones with one element and the same rank, which broadcast and reduce over
    the same dims. An op with a shape requirement of its own (linalg.cross wants length 3) can
    refuse them: the error is believed only if stand-ins of the real shapes (expanded from one
    element, so they cost no memory; a written argument is allocated) fail too. `real_only` goes
    straight to those (see `cpu_error_instead`), as do the ops whose shapes only CPU checks
    (`SHAPE_PROBED`). Index arguments stand in as zeros, an index valid in any non-empty dim."""
    def stand_in(x, real: bool, written: bool = False, index: bool = False):
        if isinstance(x, TpuTensor):
            if not real:
                return (torch.zeros if index else torch.ones)((1,) * x.dim(), dtype=x.dtype)
            if written:
                return torch.ones(x.shape, dtype=x.dtype)
            return (torch.zeros if index else torch.ones)((), dtype=x.dtype).expand(x.shape)
        if isinstance(x, torch.Tensor):
            return x.detach().clone()
        if isinstance(x, (list, tuple)):
            return type(x)(stand_in(y, real, index=index) for y in x)
        if isinstance(x, torch.device) or isinstance(x, str) and x.startswith("tpu"):
            return torch.device("cpu")
        return x

    def call(real: bool):
        inplace = func._schema.is_mutable
        names = [a.name for a in func._schema.arguments]
        pargs = tuple(stand_in(a, real, inplace and i == 0, names[i] in _INDEX_ARGUMENTS) for i, a in enumerate(args))
        return func(*pargs, **{k: None if k == "generator" else stand_in(v, real, inplace and k == "out",
                                                                        k in _INDEX_ARGUMENTS)
                               for k, v in kwargs.items()})

    # fork_rng: a random op's rehearsal must not move CPU's random stream
    with torch.no_grad(), torch.utils._python_dispatch._disable_current_modes(), warnings.catch_warnings(), \
            torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        if real_only or func in SHAPE_PROBED or _has_empty(args):
            return call(real=True)
        try:
            return call(real=False)
        except Exception:  # noqa: BLE001
            return call(real=True)


def cpu_error_instead(func, args: tuple, kwargs: dict, err: BaseException) -> None:
    """A meta kernel refused the call: raise CPU's error for it where CPU raises one. Meta
    kernels and decompositions word their checks their own way ("Invalid channel dimensions"
    for a conv given the wrong channels) or use `assert` (an AssertionError where CPU raises
    RuntimeError), and a user's `except RuntimeError` and error message should not depend on
    the device. Only failing calls pay for this, once per new signature. An error a lowering's
    own `meta=` rule got from CPU's kernel (`from_cpu`) is already that error."""
    if getattr(err, "from_cpu", False):
        raise err
    try:
        run_cpu_probe(func, args, kwargs, real_only=True)
    except Exception as cpu:  # noqa: BLE001
        raise cpu.with_traceback(None) from None
    raise err


def cpu_meta_instead(func, args: tuple, kwargs: dict, err: BaseException):
    """An elementwise op's meta kernel refused a call CPU's kernel takes (`bool_tensor << 1`,
    an int64 result): CPU's result over stand-ins of the real shapes, as meta tensors, stands
    for the meta kernel's; a call CPU refuses raises CPU's error."""
    try:
        out = run_cpu_probe(func, args, kwargs, real_only=True)
    except Exception as cpu:  # noqa: BLE001
        raise cpu.with_traceback(None) from None
    if isinstance(out, torch.Tensor):
        # the stand-ins are expanded (stride 0), so CPU laid its result out contiguously; its
        # TensorIterator lays it out like the real inputs (`transposed_bool << 1`: seed 908)
        like = _iterator_layout(args)
        stride = like.stride() if like is not None and like.shape == out.shape else out.stride()
        return torch.empty_strided(out.shape, stride, dtype=out.dtype, device="meta")
    raise err


def _iterator_layout(args):
    """A meta tensor laid out as an elementwise op over the call's tensors would lay it out."""
    metas = [torch.empty_strided(a.shape, a.stride(), device="meta") for a in args if type(a) is TpuTensor]
    if not metas:
        return None
    like = torch.empty_like(metas[0])
    for m in metas[1:]:
        try:
            like = like + m
        except RuntimeError:
            return None
    return like


def from_cpu(call):
    """`call()`, a CPU call standing for the user's; an exception it raises is marked as CPU's
    own, which `cpu_error_instead` then leaves as it is (for ops whose CPU kernel refuses the
    probes' stand-ins, such as `_grouped_mm`, which wants real strides)."""
    try:
        with torch.utils._python_dispatch._disable_current_modes(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    except Exception as err:  # noqa: BLE001
        err.from_cpu = True
        raise
