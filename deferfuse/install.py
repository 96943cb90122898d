"""Make "tpu" a real PyTorch device through the Python PrivateUse1 backend, and `torch.tpu` its module.

After `register()`, `torch.device("tpu")`, `.to("tpu")`, `model.to("tpu")` and factory calls with
`device="tpu"` all work. Tensors themselves are `TpuTensor` wrapper subclasses whose ATen calls
reach `__torch_dispatch__` (the router, dispatch.py); factories (no tensor argument yet) reach the
PrivateUse1 dispatch key, where one boxed fallback hands them to the same router. What deferfuse
changes in torch itself is in patches.py.
"""
from __future__ import annotations

import types
import warnings
from typing import NamedTuple

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from .causes import Cause
from . import autocast, backward, claims, interrupts, memory, patches, rng, streams  # noqa: F401  (claims: registered at import)
from .api import sync
from .backward import STOP
from .dispatch import dispatch
from .executors.base import EagerMode
from .lowering import LOWERINGS
from .modes import as_mode, current, mode, set_default_mode
from .precision import precision
from .routes import out_kernels  # noqa: F401  (registers its out= kernels at import)
from .target import NAME, check_ordinal as _check_ordinal, device_index, jax_device


class _DeviceProperties(NamedTuple):
    """What `torch.tpu.get_device_properties()` says (torch.cuda's fields where JAX knows them)."""

    name: str
    type: str  # JAX's platform: tpu, gpu or cpu
    total_memory: int | None  # bytes, where the backend says (not on CPU)
    device_kind: str


class _TpuModule(types.ModuleType):
    """A module class of its own for `torch.tpu.eager_mode`, a settable property as TorchTPU's.

    Read, it is the mode the next op runs in: inside a `set_eager_mode` (or `deferfuse.mode`)
    block the block's, as `torch.is_grad_enabled()` is inside `no_grad`. Assigned, it is the
    process-wide mode, which TorchTPU checks after any block: inside a block the assignment takes
    effect when the block ends, and warns, since a read right after it gives the block's mode."""

    @property
    def eager_mode(self) -> EagerMode:
        return current().kind

    @eager_mode.setter
    def eager_mode(self, kind: "str | EagerMode") -> None:
        new = as_mode(kind)
        set_default_mode(new)
        in_force = current().kind
        if in_force is not new:
            warnings.warn(f"torch.tpu.eager_mode = {new.name} inside a set_eager_mode block sets the process-wide "
                          f"mode, used once the block ends; the block's {in_force.name} stays in force until the "
                          "block ends", stacklevel=2)


def _make_module() -> types.ModuleType:
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
        _check_ordinal(device)
        sync(cause=Cause.SYNCHRONIZE, depth=3)

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
    mod.precision = precision  # TorchTPU's scoped float32 matmul precision
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
    streams.install(mod)  # Stream, Event, current_stream, stream
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
    # once per forward op and five times per backward op. C callables, counted: a signal
    # handler's exception inside the guard would abort the process (interrupts.py)
    type_ = interrupts.guard_attribute(_PRIVATEUSE1)


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
    autocast.register()
    backward.install()
    rng.install_generator()
    patches.apply()
    torch.serialization.register_package(5, lambda obj: None, _load_onto_tpu)
    register_optimizer_step_pre_hook(_before_optimizer_step)
    register_optimizer_step_post_hook(_after_optimizer_step)
    _registered = True


def _before_optimizer_step(optimizer, args, kwargs) -> None:
    """A training step begins: DeferAndFuse makes the optimizer's new state apart."""
    if torch.compiler.is_compiling():
        return
    current().before_optimizer_step()


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    """A training step ends here: the mode in force may cut its pending work (DeferAndFuse)."""
    if torch.compiler.is_compiling():  # Dynamo traces the step: its graph replays as one node
        return
    current().after_optimizer_step()


def _load_onto_tpu(storage, location: str):
    """torch.load(..., map_location="tpu"): tpu tensors have no storage of their own to rebuild
    into (PyTorch would crash making one), so the checkpoint's tensors stay on CPU, with a warning.
    load_state_dict (modules and optimizers) copies them onto the tpu parameters as usual."""
    global _WARNED_LOAD
    if not location.startswith(NAME):
        return None
    if not _WARNED_LOAD:
        _WARNED_LOAD = True
        warnings.warn("deferfuse: torch.load(map_location='tpu') loads the checkpoint's tensors on CPU: move them "
                      "with .to('tpu'), or let model.load_state_dict / optimizer.load_state_dict copy them")
    return storage


_WARNED_LOAD = False



def _lowered_factories() -> list:
    """Factories with a lowering of their own (arange, full, zeros, eye, linspace, ...).

    Their CompositeExplicitAutograd kernels would otherwise run first for a tpu device: an empty
    tensor, then the out= variant, which for arange also resizes it. That is three dispatches for
    the position ids a transformer makes every step, against one node."""
    return [op for op in LOWERINGS
            if not any("Tensor" in str(a.type) for a in op._schema.arguments)
            and any(a.name == "device" for a in op._schema.arguments)]


def _factory(op):
    def impl(*args, **kwargs):
        return dispatch(op, args, kwargs)

    return impl


_impls = None


def _copy_from(src, dst, non_blocking=False):
    out = dispatch(torch.ops.aten.copy_.default, (dst, src), {})
    return STOP if out is STOP else dst  # STOP: the engine must fail here (backward.py)


def _local_scalar_dense(t):
    return dispatch(torch.ops.aten._local_scalar_dense.default, (t,), {})

