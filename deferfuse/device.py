"""Make "tpu" a real PyTorch device through the Python PrivateUse1 backend.

After import, `torch.device("tpu")`, `.to("tpu")`, `model.to("tpu")` and factory calls with
`device="tpu"` all work. Tensors themselves are `TpuTensor` wrapper subclasses whose ATen calls
reach `__torch_dispatch__`; factories (no tensor argument yet) reach the PrivateUse1 dispatch key,
where one boxed fallback hands them to the same dispatcher.
"""
from __future__ import annotations

import functools
import types
import warnings
from typing import NamedTuple

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import memory
from .executors.base import EagerMode
from .modes import get_default_mode, mode, set_default_mode
from .target import NAME, check_ordinal as _check_ordinal, device_index, jax_device


class _DeviceProperties(NamedTuple):
    """What `torch.tpu.get_device_properties()` says (torch.cuda's fields where JAX knows them)."""

    name: str
    type: str  # JAX's platform: tpu, gpu or cpu
    total_memory: int | None  # bytes, where the backend says (not on CPU)
    device_kind: str


class _TpuModule(types.ModuleType):
    """A module class of its own for `torch.tpu.eager_mode`, a settable property as TorchTPU's."""

    @property
    def eager_mode(self):
        return get_default_mode()

    @eager_mode.setter
    def eager_mode(self, kind) -> None:
        set_default_mode(kind)


def _make_module() -> types.ModuleType:
    from . import rng

    mod = _TpuModule("torch.tpu", "deferfuse's torch.tpu: the 'tpu' device backed by JAX")

    def is_available() -> bool:
        return True

    def is_initialized() -> bool:
        return True

    def device_count() -> int:
        return 1

    def current_device() -> int:
        return 0

    def _is_in_bad_fork() -> bool:
        return False

    def synchronize(device=None) -> None:
        from .api import sync

        _check_ordinal(device)
        sync(cause="synchronize", depth=3)

    def get_device_name(device=None) -> str:
        if device_index(device) != 0:
            raise AssertionError("Invalid device id")  # torch.cuda.get_device_properties' check
        return str(jax_device())

    def get_amp_supported_dtype() -> list:
        # what torch.autocast("tpu") asks before it turns on autocast.py's rules
        return [torch.bfloat16, torch.float16]

    class device:
        """`with torch.tpu.device(i)`: one device, so selecting it changes nothing (torch.load's
        map_location and checkpointing's RNG bookkeeping use it, as with torch.cuda.device)."""

        def __init__(self, index):
            _check_ordinal(index)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def set_device(index) -> None:
        device(index)

    def get_device_properties(device=None) -> _DeviceProperties:
        get_device_name(device)  # its index check
        d = jax_device()
        return _DeviceProperties(str(d), d.platform, memory.total(d), getattr(d, "device_kind", d.platform))

    def memory_allocated(device=None) -> int:
        _check_ordinal(device)
        return memory.allocated(jax_device())

    def max_memory_allocated(device=None) -> int:
        _check_ordinal(device)
        return memory.max_allocated(jax_device())

    def reset_peak_memory_stats(device=None) -> None:
        _check_ordinal(device)
        memory.reset_peak(jax_device())

    def memory_stats(device=None) -> dict:
        _check_ordinal(device)
        return memory.stats(jax_device())

    def empty_cache() -> None:
        """Nothing to release: JAX frees a buffer when its last array goes."""

    mod.get_device_properties = get_device_properties
    mod.memory_allocated = memory_allocated
    mod.max_memory_allocated = max_memory_allocated
    mod.reset_peak_memory_stats = reset_peak_memory_stats
    mod.memory_stats = memory_stats
    mod.empty_cache = empty_cache
    # TorchTPU's mode API: torch.tpu.eager_mode (a property, above), set_eager_mode (a block)
    mod.EagerMode = EagerMode
    mod.set_eager_mode = mode
    mod.device = device
    mod.set_device = set_device
    # checkpoint() saves and restores a device's RNG state only once its backend says it is
    # initialised: without it, a recomputed dropout drew a new mask
    mod._initialized = True
    mod.get_amp_supported_dtype = get_amp_supported_dtype
    mod.is_available = is_available
    mod.is_initialized = is_initialized
    mod.device_count = device_count
    mod.current_device = current_device
    mod._is_in_bad_fork = _is_in_bad_fork
    mod.synchronize = synchronize
    mod.get_device_name = get_device_name
    mod.manual_seed = rng.manual_seed
    mod.manual_seed_all = rng.manual_seed
    mod.seed = rng.seed
    mod.seed_all = rng.seed
    mod.initial_seed = rng.initial_seed
    mod.get_rng_state = rng.get_rng_state
    mod.set_rng_state = rng.set_rng_state
    return mod


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_PRIVATEUSE1 = torch._C._autograd.DeviceType.PrivateUse1


class _Guard(torch._C._acc.DeviceGuard):
    # PyTorch's C++ side asks this on every device and stream guard: autograd calls it about
    # once per forward op and five times per backward op, each a trip into Python
    def type_(self):
        return _PRIVATEUSE1


_registered = False
_lib = None


def register() -> None:
    global _registered, _lib
    if _registered:
        return
    if torch._C._get_privateuse1_backend_name() not in ("privateuseone", NAME):  # target.py claims NAME
        raise RuntimeError(
            f"deferfuse: PrivateUse1 is already registered as {torch._C._get_privateuse1_backend_name()!r}"
        )
    _setup_privateuseone_for_python_backend(NAME, backend_module=_make_module(), hook=_Hooks(), device_guard=_Guard())
    from .dispatch import dispatch

    def _factory_fallback(op, *args, **kwargs):
        return dispatch(op, args, kwargs)

    _lib = torch.library.Library("_", "IMPL")
    _lib.fallback(_factory_fallback, "PrivateUse1")
    # Ops that C++ kernels call below the Python key (CPU's copy_ calls _copy_from on the
    # destination's device) need a registration of their own: PyTorch's boxed Python fallback
    # only serves ops that reach it from a Python-visible call.
    # The same goes for factories that BackendSelect redispatches straight to the backend.
    global _impls
    _impls = torch.library.Library("aten", "IMPL")
    for name in ("_copy_from", "_copy_from_and_resize"):
        _impls.impl(name, _copy_from, "PrivateUse1")
    # torch.tensor([a, b]) over tpu scalars reads each with the Python key excluded
    _impls.impl("_local_scalar_dense", _local_scalar_dense, "PrivateUse1")
    for op in (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default, *_lowered_factories()):
        _impls.impl(op._schema.name.split("::")[1] + "." + op._overloadname if op._overloadname != "default"
                    else op._schema.name.split("::")[1], _factory(op), "PrivateUse1")
    from . import autocast

    autocast.register()
    _keep_shared_parameters_shared()
    _lazy_modules()
    _skip_pinning()
    from . import backward

    backward.install()
    _refuse_fx_tracing()
    _follow_default_dtype()
    from . import rng

    rng.install_generator()
    _accelerator_synchronize()
    torch.serialization.register_package(5, lambda obj: None, _load_onto_tpu)
    _registered = True


_ACCELERATOR_CALLS = ("synchronize", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
                      "memory_stats", "empty_cache")


def _accelerator_synchronize() -> None:
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
    makes, but not the call's signature, under which deferfuse caches what a call makes: the
    caches that hold output dtypes are emptied when the default changes."""
    from . import dispatch, expansion, mutation, special

    def forget():
        dispatch.forget_recipes()
        for cache in (mutation._INPLACE, expansion._KEPT, special._UNINIT):
            cache.clear()

    for name in ("set_default_dtype", "set_default_tensor_type"):
        setter = getattr(torch, name)

        @functools.wraps(setter)
        def set_default(*args, _setter=setter, **kwargs):
            before = torch.get_default_dtype()
            out = _setter(*args, **kwargs)
            if torch.get_default_dtype() != before:
                forget()
            return out

        setattr(torch, name, set_default)


def _refuse_fx_tracing() -> None:
    """make_fx over tpu tensors cannot trace them: a tpu op runs below the tracer, so its result
    enters the graph as a constant. `torch.func.linearize` then returned the tangent of the trace
    inputs for every call (zeros, for the zeros it traces with); an error says so instead."""
    from torch._functorch import eager_transforms
    from torch.fx.experimental import proxy_tensor
    from torch.utils._pytree import tree_leaves

    from .tensor import TpuTensor

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


def _load_onto_tpu(storage, location: str):
    """torch.load(..., map_location="tpu"): tpu tensors have no storage of their own to rebuild
    into (PyTorch would crash making one), so the checkpoint's tensors stay on CPU, with a warning.
    load_state_dict (modules and optimizers) copies them onto the tpu parameters as usual."""
    if not location.startswith(NAME):
        return None
    if not _WARNED_LOAD[0]:
        _WARNED_LOAD[0] = True
        warnings.warn("deferfuse: torch.load(map_location='tpu') loads the checkpoint's tensors on CPU: move them "
                      "with .to('tpu'), or let model.load_state_dict / optimizer.load_state_dict copy them")
    return storage


_WARNED_LOAD = [False]


def _skip_pinning() -> None:
    """DataLoader(pin_memory=True) pins batches for the current accelerator, tpu here, and
    PyTorch has no pinned allocator for a Python backend (it raised). Host-to-tpu copies go
    through NumPy and gain nothing from pinning, so batches pass through unpinned, as PyTorch
    itself does for MPS."""
    from torch.utils.data._utils import pin_memory as pinning

    pin = pinning.pin_memory

    def pin_memory(data, device=None):
        if device == NAME or device is None and _current_accelerator_is_tpu():
            return data
        return pin(data, device)

    pinning.pin_memory = pin_memory


def _current_accelerator_is_tpu() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == NAME


_APPLYING = [False]


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
        if _APPLYING[0] or not recurse:
            return apply(self, fn, recurse)
        owners: dict[int, list] = {}
        for mod in self.modules():
            for key, p in mod._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append((mod, key))
        lazy = _set_aside_uninitialized(self, fn)
        _APPLYING[0] = True
        try:
            out = apply(self, fn, recurse)
        finally:
            _APPLYING[0] = False
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
    from torch.nn.parameter import UninitializedTensorMixin

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
    from torch.nn.modules.lazy import LazyModuleMixin
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

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


def _lowered_factories() -> list:
    """Factories with a lowering of their own (arange, full, zeros, eye, linspace, ...).

    Their CompositeExplicitAutograd kernels would otherwise run first for a tpu device: an empty
    tensor, then the out= variant, which for arange also resizes it. That is three dispatches and
    about 0.25 ms for the position ids a transformer makes every step, against one node."""
    from .lowering import LOWERINGS

    return [op for op in LOWERINGS
            if not any("Tensor" in str(a.type) for a in op._schema.arguments)
            and any(a.name == "device" for a in op._schema.arguments)]


def _factory(op):
    def impl(*args, **kwargs):
        from .dispatch import dispatch

        return dispatch(op, args, kwargs)

    return impl


_impls = None


def _copy_from(src, dst, non_blocking=False):
    from .backward import STOP
    from .dispatch import dispatch

    out = dispatch(torch.ops.aten.copy_.default, (dst, src), {})
    return STOP if out is STOP else dst  # STOP: the engine must fail here (backward.py)


def _local_scalar_dense(t):
    from .dispatch import dispatch

    return dispatch(torch.ops.aten._local_scalar_dense.default, (t,), {})

