"""What deferfuse changes in torch itself, each change named and explained where it is made.

Each exists because a PyTorch path assumes a C++ backend (an allocator, `set_data`, pinned
memory, a device guard) or caches what a call makes under a key the default dtype is not part of.
`apply()` makes them all, once, from install.register().
"""
from __future__ import annotations

import functools

import torch
import torch.optim.optimizer as _optimizer
import torch.utils._foreach_utils as _foreach_utils
from torch._functorch import eager_transforms
from torch.fx.experimental import proxy_tensor
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter, UninitializedTensorMixin
from torch.utils._pytree import tree_leaves
from torch.utils.data._utils import pin_memory as pinning

from . import dtypes, modes
from .target import NAME
from .tensor import TpuTensor


def apply() -> None:
    _keep_shared_parameters_shared()
    _lazy_modules()
    _skip_pinning()
    _refuse_fx_tracing()
    _follow_default_dtype()
    _accelerator_calls()
    _enable_foreach_paths()
    _matrix_rank_out_in_blocks()


def _enable_foreach_paths() -> None:
    """Let torch.optim and clip_grad_norm_ take their foreach paths for tpu tensors.

    PyTorch only picks `_foreach_*` kernels for tensors whose exact type is in a short list, and
    TpuTensor is a subclass; deferfuse records each foreach call as one node, so this is the fast
    path (one program input per list instead of one op per parameter).
    """
    for types in (_optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if TpuTensor not in types:
            types.append(TpuTensor)


_ACCELERATOR_CALLS = ("synchronize", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
                      "memory_stats", "empty_cache")


def _accelerator_calls() -> None:
    """torch.accelerator's synchronize() and memory queries ask the backend's C++ device guard and
    caching allocator, which a Python backend has no way to provide ("Backend doesn't support
    synchronizing all streams", an internal assert for memory): for tpu they are torch.tpu's."""
    accelerator = torch.accelerator
    for name in _ACCELERATOR_CALLS:
        theirs = getattr(accelerator, name)

        @functools.wraps(theirs)
        def call(*args, _name=name, _theirs=theirs, **kwargs):
            current = accelerator.current_accelerator()
            if current is not None and current.type == NAME:
                return getattr(torch.tpu, _name)(*args, **kwargs)
            return _theirs(*args, **kwargs)

        setattr(accelerator, name, call)


def _follow_default_dtype() -> None:
    """torch.set_default_dtype changes what `torch.ones(2, device="tpu")` or `arange(3) / 2`
    makes, but not the call's signature, under which deferfuse caches what a call makes: each
    such cache registers a forget hook (`dtypes.on_default_dtype_change`), run when the default
    changes."""
    for name in ("set_default_dtype", "set_default_tensor_type"):
        setter = getattr(torch, name)

        @functools.wraps(setter)
        def set_default(*args, _setter=setter, **kwargs):
            before = torch.get_default_dtype()
            out = _setter(*args, **kwargs)
            if torch.get_default_dtype() != before:
                dtypes.default_dtype_changed()
            return out

        setattr(torch, name, set_default)


def _refuse_fx_tracing() -> None:
    """make_fx over tpu tensors cannot trace them: a tpu op runs below the tracer, so its result
    enters the graph as a constant. `torch.func.linearize` then returned the tangent of the trace
    inputs for every call (zeros, for the zeros it traces with); an error says so instead."""
    trace = proxy_tensor.make_fx

    @functools.wraps(trace)
    def make_fx(f, *args, **kwargs):
        traced = trace(f, *args, **kwargs)

        @functools.wraps(traced)
        def run(*inputs):
            if any(isinstance(x, TpuTensor) for x in tree_leaves(inputs)):
                raise NotImplementedError(
                    "deferfuse: make_fx cannot trace tpu tensors (torch.func.linearize, torch.export and "
                    "torch.compile trace with it); run the function itself, or trace it on CPU")
            return traced(*inputs)

        return run

    proxy_tensor.make_fx = make_fx
    eager_transforms.make_fx = make_fx  # linearize's own reference


def _skip_pinning() -> None:
    """DataLoader(pin_memory=True) pins batches for the current accelerator, tpu here, and
    PyTorch has no pinned allocator for a Python backend (it raised). Host-to-tpu copies go
    through NumPy and gain nothing from pinning, so batches pass through unpinned, as PyTorch
    itself does for MPS."""
    pin = pinning.pin_memory

    def pin_memory(data, device=None):
        if device == NAME or device is None and _current_accelerator_is_tpu():
            return data
        return pin(data, device)

    pinning.pin_memory = pin_memory


def _current_accelerator_is_tpu() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == NAME


_APPLYING = False


def _keep_shared_parameters_shared() -> None:
    """`model.to("tpu")` keeps a parameter that several modules share (tied embedding and output
    weights) shared.

    For CUDA, Module._apply moves each parameter in place (`set_data`), so sharing survives. A
    tensor subclass cannot take `set_data`: each module then gets a new Parameter, and a tied
    weight silently becomes two that train apart. PyTorch's alternative, swapping contents into
    the old objects, fails for a parameter a live autograd graph holds (the old weight_norm API's)
    and, switched on globally, changes load_state_dict for CPU modules too. So the outermost
    `_apply` notes which modules share a parameter and makes them share its replacement."""
    apply = torch.nn.Module._apply

    def _apply(self, fn, recurse=True):
        global _APPLYING
        if _APPLYING or not recurse:
            return apply(self, fn, recurse)
        owners: dict[int, list] = {}
        for mod in self.modules():
            for key, p in mod._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append((mod, key))
        lazy = _set_aside_uninitialized(self, fn)
        _APPLYING = True
        try:
            out = apply(self, fn, recurse)
        finally:
            _APPLYING = False
            _put_back(lazy)
        for group in owners.values():
            first = group[0][0]._parameters[group[0][1]]
            for mod, key in group[1:]:
                mod._parameters[key] = first
        return out

    torch.nn.Module._apply = _apply


# --- lazy modules --------------------------------------------------------------------------------
# An uninitialized parameter is a tensor subclass of its own, which a tpu tensor (another one)
# cannot become: `.to("tpu")` failed on it, and so did LazyLinear(..., device="tpu"). Instead
# it stays a 0-element CPU placeholder marked with the device it should live on, and the lazy
# module moves itself there once its first forward has shaped and initialised it.
_LAZY_DEVICE = "_deferfuse_device"


def _set_aside_uninitialized(root, fn) -> list:
    """Take the uninitialized parameters and buffers out of `root`'s modules for a conversion
    to tpu, marking them; returns what `_put_back` needs."""
    found = [(d, key) for mod in root.modules() for d in (mod._parameters, mod._buffers)
             for key, t in d.items() if isinstance(t, UninitializedTensorMixin)]
    if not found:
        return []
    device = fn(torch.empty(0)).device  # where this conversion sends tensors
    if device.type != NAME:
        return []
    tables = {id(d): (d, list(d)) for d, _ in found}  # each table's order: state_dict keeps it
    held = {(id(d), key): d.pop(key) for d, key in found}
    for t in held.values():
        t.__dict__[_LAZY_DEVICE] = device
    return [(d, order, held) for d, order in tables.values()]


def _put_back(set_aside: list) -> None:
    for d, order, held in set_aside:
        rest = dict(d)
        d.clear()
        for key in order:
            d[key] = held[(id(d), key)] if (id(d), key) in held else rest.pop(key)
        d.update(rest)


def _lazy_modules() -> None:
    for cls in (UninitializedParameter, UninitializedBuffer):
        new = cls.__new__

        def __new__(cls, *args, _new=new, **kwargs):
            device = kwargs.get("device")
            if device is None or torch.device(device).type != NAME:
                return _new(cls, *args, **kwargs)
            t = _new(cls, *args, **{**kwargs, "device": "cpu"})
            t.__dict__[_LAZY_DEVICE] = torch.device(device)
            return t

        cls.__new__ = __new__

    infer = LazyModuleMixin._infer_parameters

    def _infer_parameters(self, module, args, kwargs=None):
        targets = {t.__dict__.get(_LAZY_DEVICE) for d in (module._parameters, module._buffers) for t in d.values()
                   if t is not None} - {None}
        out = infer(self, module, args, kwargs)
        for device in targets:
            module.to(device)
        return out

    LazyModuleMixin._infer_parameters = _infer_parameters


def _matrix_rank_out_in_blocks() -> None:
    """`torch.linalg.matrix_rank(a, out=o)` writes `o` inside a mode block, as outside.

    A block is a TorchDispatchMode, and PyTorch's matrix_rank out= kernel, seeing any dispatch mode
    active (`isTensorSubclassLike`), computes a fresh result and rebinds its C++ reference to it
    instead of writing into `o`: a CPU call that silently left its output unwritten. Inside a
    block the call runs as PyTorch's (its checks and resize included), then the value is copied in."""
    original = torch.linalg.matrix_rank

    @functools.wraps(original)
    def matrix_rank(*args, out=None, **kwargs):
        if out is None or not modes._stack:
            return original(*args, out=out, **kwargs) if out is not None else original(*args, **kwargs)
        original(*args, out=out, **kwargs)
        return out.copy_(original(*args, **kwargs))

    torch.linalg.matrix_rank = matrix_rank
