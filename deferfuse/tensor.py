"""The "tpu" tensor: a PyTorch wrapper subclass over a storage that holds a jax.Array or a pending value.

A `TpuTensor` carries only metadata (size, stride, storage offset, dtype: PyTorch's own, so
`t.shape` never syncs) and a reference to a `Storage`, which holds one value: a concrete
`jax.Array`, a pending value of the current graph, or nothing yet (uninitialised memory). Views share
the storage, so aliasing is exactly PyTorch's. The storage offset lives in the view layout
(`offset_of`), so a whole-storage tensor carries no view state at all.
"""
from __future__ import annotations

import copy
import math
import weakref
from collections import OrderedDict

import jax
import numpy as np
import torch
from torch._tensor_str import _add_suffixes, _tensor_str

from .causes import Cause
from . import backward, device_dtypes, dtypes, views
from .interned import LAYOUTS, layout_id  # noqa: F401  (tensor's API since before interned.py)
from .target import NAME, jax_device

DEVICE = torch.device(NAME, 0)


class Storage:
    """One buffer, in a row-major "physical" `shape`.

    Exactly one of three states: concrete (`value` is a jax.Array), pending (`graph` is the
    current pending graph and `ref` names the value there), or uninitialised (neither; reads as
    zeros). A new value replaces the old one; arrays are never mutated.
    """

    # `facade`: what `untyped_storage()` returns, made on first use (see `storage_facade`)
    __slots__ = ("value", "graph", "ref", "shape", "dtype", "error", "copy_of", "facade", "__weakref__")

    def __init__(self, value, shape: tuple, dtype: torch.dtype, graph=None, ref: int = 0):
        self.value = value
        self.graph = graph
        self.ref = ref
        self.shape = shape
        self.dtype = dtype
        self.error = None
        # set when this storage stands for a view PyTorch would alias but deferfuse copies
        # (dtype-reinterpreting views): writing into it must not silently miss the base
        self.copy_of = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def set_pending(self, graph, ref: int) -> None:
        if self.graph is not graph:  # already pending there: the graph tracks it once
            v = self.value
            if v is not None:
                pos = graph.input_pos.get(id(v))  # the graph holds its inputs, so the id is theirs
                if pos is not None:
                    graph.prior[id(self)] = pos
            before = graph.before
            if before is not None:  # a graph recorded and abandoned (compiler/dry_record.py)
                before.append((self, v, self.graph, self.ref, self.error))
            self.graph = graph
            graph.storages.append(weakref.ref(self))
        self.value = None
        self.ref = ref

    def set_value(self, array) -> None:
        self.value = array
        self.graph = None


# What the next host read is for (print, bool, item, ...): set by the dunder methods below so a
# flush can name its cause, consumed by the dispatcher.
_sync_cause: str | None = None


def sync_cause() -> str | None:
    return _sync_cause


def _with_cause(cause: str, fn, *args):
    global _sync_cause
    prev = _sync_cause
    if prev is None:
        _sync_cause = cause
    try:
        return fn(*args)
    finally:
        _sync_cause = prev


class TpuTensor(torch.Tensor):
    """A tensor on the "tpu" device. Its ATen calls go to deferfuse's dispatcher."""

    # Slots, not the instance __dict__ PyTorch gives every tensor: the three are set on every
    # recorded op's output, and a slot write skips creating that dict
    __slots__ = ("_st", "_lay", "_lid")
    _st: Storage
    _lay: tuple | None  # None: the tensor is its whole storage, contiguous; else (plan, offset)
    _lid: int  # interned (size, stride, dtype)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # importing deferfuse installs `dispatch.torch_dispatch` here (dispatch.py's last line)
        raise RuntimeError("deferfuse dispatcher not initialised")

    # Host reads: name the cause, then let PyTorch's C++ do the rest through our dispatcher.
    def __setitem__(self, index, value):
        """CPU PyTorch writes a 0-dim CPU value with `fill_`, which makes no overlap check
        (`x.view(1, 1)[...] = x` works); a value on any other device is copied as an expanded
        view, which refuses the overlap. A 0-dim value of this tensor's storage is read first, as
        fill_ reads it, so the write works as on CPU."""
        if type(value) is TpuTensor and value.dim() == 0 and value._st is self._st:
            value = value.clone()
        super().__setitem__(index, value)

    def __bool__(self):
        return _with_cause(Cause.BOOL, torch.Tensor.__bool__, self)

    def __float__(self):
        return _with_cause(Cause.FLOAT, torch.Tensor.__float__, self)

    def __int__(self):
        return _with_cause(Cause.INT, torch.Tensor.__int__, self)

    def __index__(self):
        return _with_cause(Cause.INT, torch.Tensor.__index__, self)

    def __complex__(self):
        return _with_cause(Cause.FLOAT, torch.Tensor.__complex__, self)

    def item(self):
        return _with_cause(Cause.ITEM, torch.Tensor.item, self)

    def tolist(self):
        return _with_cause(Cause.TOLIST, lambda: torch.Tensor.tolist(self.cpu()))

    def numpy(self, *, force: bool = False):
        if force:
            return _with_cause(Cause.TO_CPU, lambda: self.detach().cpu().numpy())
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to "
            "host memory first."
        )

    def __repr__(self, *, tensor_contents=None):
        text = _with_cause(Cause.PRINT, _repr, self)
        # nn.Parameter's own repr (a tpu parameter is a TpuTensor flagged as one)
        return "Parameter containing:\n" + text if getattr(self, "_is_param", False) else text

    def __format__(self, spec):
        if self.dim() == 0 and not self.is_meta and type(self) is TpuTensor:
            return _with_cause(Cause.PRINT, lambda: self.item().__format__(spec))
        return object.__format__(self, spec)

    # The engine calls these hooks from C++, where an exception they raise would abort the
    # process: backward.py parks it for backward() to raise
    def register_hook(self, hook):
        return torch.Tensor.register_hook(self, backward.guard_hook(hook, backward.tensor_hook_failed))

    def register_post_accumulate_grad_hook(self, hook):
        return torch.Tensor.register_post_accumulate_grad_hook(
            self, backward.guard_hook(hook, backward.tensor_hook_failed))

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        # AOTAutograd's question to a tensor subclass reaching a compiled backward as a tangent:
        # to it, a tpu tensor is a plain device tensor (deferfuse/compiler), nothing to coerce
        return self

    def untyped_storage(self) -> torch.UntypedStorage:
        return storage_facade(self._st)

    def data_ptr(self) -> int:
        base = storage_facade(self._st).data_ptr()
        return base + offset_of(self) * self.element_size() if base else 0

    def __reduce_ex__(self, proto):
        # PyTorch's own rebuild for device tensors without host storage (XLA's): in torch.load's
        # weights_only allowlist, and it honours map_location, so a checkpoint saved on tpu loads
        # on a machine without deferfuse with map_location="cpu". A parameter is rebuilt as one,
        # as nn.Parameter's own reduction does (a whole pickled model needs its Parameters back).
        if getattr(self, "_is_param", False):
            return (torch._utils._rebuild_parameter, (self.detach(), self.requires_grad, OrderedDict()))
        cpu = self.detach().cpu()
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor, (cpu, self.dtype, str(self.device),
                                                                      self.requires_grad))

    def __deepcopy__(self, memo):
        # PyTorch's clones, then deep-copies __dict__ over the clone, which would put a copy of
        # the source's storage (a pending one with a copy of its graph) in place of the clone's
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            return torch.Tensor.__deepcopy__(self, memo)  # raises PyTorch's error for non-leaves
        if getattr(self, "_is_param", False):  # what Parameter.__deepcopy__ does: no grad, no attributes
            with torch.no_grad():
                new = memo[id(self)] = torch.nn.Parameter(self.clone(), self.requires_grad)
            return new
        with torch.no_grad():
            new = self.clone()
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        own = {k: v for k, v in self.__dict__.items() if k not in _INTERNAL}
        new.__dict__.update(copy.deepcopy(own, memo))
        memo[id(self)] = new
        return new

    @property
    def data(self):
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, new):
        if not isinstance(new, TpuTensor):
            raise RuntimeError(
                f"deferfuse: cannot set .data of a tpu tensor to a tensor on {new.device}; move it with .to('tpu') first"
            )
        torch.Tensor.data.__set__(self, new)
        self._st, self._lay, self._lid = new._st, new._lay, new._lid


_INTERNAL = ("_st", "_lay", "_lid")


def _rebuild(cpu: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """Loads checkpoints written before __reduce_ex__ used PyTorch's rebuild (weights_only=False)."""
    return cpu.to(DEVICE).requires_grad_(requires_grad)


_make = torch.Tensor._make_wrapper_subclass  # called positionally: keyword parsing costs time per tensor
_STRIDED = torch.strided


def new_tensor(st: Storage, size: tuple, stride: tuple, dtype: torch.dtype, lid: int, lay) -> TpuTensor:
    if lay is None:
        t = _make(TpuTensor, size, None, None, None, dtype, _STRIDED, DEVICE)
    else:
        t = _make(TpuTensor, size, stride, lay[1], None, dtype, _STRIDED, DEVICE)
    t._st = st
    t._lay = lay
    t._lid = lid
    return t


# Device addresses for `data_ptr()`. The data lives in jax.Arrays whose memory PyTorch never
# sees, but libraries tell tensors apart, and find the ones that share memory, by their storage's
# pointer: safetensors and transformers do before saving a state dict. Each storage gets an
# address range of its own when one is first asked for; nothing dereferences it, as nothing
# dereferences a CUDA pointer on the host.
_NEXT_ADDRESS = [0x7E00_0000_0000]
_construct_storage = torch._C._construct_storage_from_data_pointer


def storage_facade(st: Storage) -> torch.UntypedStorage:
    """The UntypedStorage a tpu tensor reports: its storage's size and device, and an address of
    its own (0 when empty, as CUDA's). The same object for every view of the storage, so that
    PyTorch's storage-identity checks (`StorageWeakRef`) see views as sharing it."""
    facade = getattr(st, "facade", None)  # a slot set on first use only: Storage() is on the hot path
    if facade is None:
        nbytes = st.nbytes
        address = 0
        if nbytes:
            address = _NEXT_ADDRESS[0]
            _NEXT_ADDRESS[0] += -(-nbytes // 512) * 512
        facade = st.facade = _construct_storage(address, DEVICE, nbytes)
    return facade


def offset_of(t: TpuTensor) -> int:
    lay = t._lay
    return 0 if lay is None else lay[1]


_PLANS: dict[tuple, tuple | None] = {}


def layout_for(st: Storage, size: tuple, stride: tuple, offset: int):
    """None when the view is its whole storage read contiguously, else (read plan, offset).

    Plans are cached per (storage shape, size, stride, offset): views are created on every step
    of a training loop, and planning costs far more than a dict lookup.
    """
    key = (st.shape, size, stride, offset)
    try:
        plan = _PLANS[key]
    except KeyError:
        if offset == 0 and size == st.shape and views.is_contiguous(size, stride):
            plan = None
        else:
            plan = views.plan_view(st.shape, size, stride, offset)
        if len(_PLANS) > 200_000:
            _PLANS.clear()
        _PLANS[key] = plan
    return None if plan is None else (plan, offset)


def view_of(base: TpuTensor, size: tuple, stride: tuple, offset: int, dtype: torch.dtype | None = None) -> TpuTensor:
    st = base._st
    dtype = dtype or base.dtype
    return new_tensor(st, size, stride, dtype, layout_id(size, stride, dtype), layout_for(st, size, stride, offset))


def phys_layout(size: tuple, stride: tuple) -> tuple[tuple, tuple | None]:
    """Physical shape for a fresh storage holding a tensor with these strides, and the
    permutation from logical to physical dims (None when already contiguous)."""
    if views.is_contiguous(size, stride):
        return size, None
    perm = views.dense_permutation(size, stride)
    if perm is not None:
        return tuple(size[d] for d in perm), perm
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(n > 0 for n in size) else 0
    return (extent,), "strided"


def from_concrete(array: jax.Array, dtype: torch.dtype) -> TpuTensor:
    """Wrap a concrete logical-shape array as a fresh contiguous tensor."""
    size = tuple(array.shape)
    stride = views.contiguous_strides(size)
    st = Storage(array, size, dtype)
    return new_tensor(st, size, stride, dtype, layout_id(size, stride, dtype), None)


def host_to_jax(t: torch.Tensor, op: str | None = None) -> jax.Array:
    """A device copy of a CPU tensor's logical contents (never aliasing torch's memory), in a dtype
    the device holds (device_dtypes.py: else NotImplementedError naming `op`, the dtype, the device)."""
    device_dtypes.check(t.dtype, op)
    return jax.device_put(np.array(dtypes.torch_to_numpy(t), copy=True), jax_device())


def jax_to_host(array, dtype: torch.dtype) -> torch.Tensor:
    return dtypes.numpy_to_torch(np.asarray(array), dtype)


def redispatch(func, args: tuple, kwargs: dict):
    """Serve an ATen call from inside deferfuse (a route that runs smaller ops, a factory): back
    through the router the way PyTorch enters it, so no route imports the router above it."""
    return TpuTensor.__torch_dispatch__(func, None, args, kwargs)


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
            _aten.as_strided_.default(t, size, stride, off)
        else:
            donor = torch.Tensor._make_wrapper_subclass(TpuTensor, (extent,), dtype=t.dtype, device=DEVICE)
            _aten.set_.source_Storage_storage_offset._op_dk(
                torch._C.DispatchKey.Meta, t, _wrapper_storage(donor), off, size, stride
            )
    t._lid = layout_id(size, stride, t.dtype)
    t._lay = layout_for(t._st, size, stride, off)


_aten = torch.ops.aten
_wrapper_storage = torch.Tensor.untyped_storage  # the wrapper's own C++ storage, not the data_ptr facade


def _repr(t: TpuTensor) -> str:
    cpu = t.detach().cpu()
    prefix = "tensor("
    if t.is_nested:
        raise NotImplementedError("nested tpu tensors")
    contents = _tensor_str(cpu, len(prefix))
    suffixes = [f"device='{t.device}'"]
    if cpu.numel() == 0 and cpu.dim() != 1:
        suffixes.append(f"size={tuple(cpu.shape)}")
    default = torch.get_default_dtype()
    # as CPU's repr: an empty tensor shows any dtype but the default (nothing to infer it from)
    implied = (default,) if cpu.numel() == 0 else \
        (default, torch.int64, torch.bool, torch.complex128 if default == torch.float64 else torch.complex64)
    if t.dtype not in implied:
        suffixes.append(f"dtype={t.dtype}")
    if t.grad_fn is not None:
        name = type(t.grad_fn).__name__
        suffixes.append(f"grad_fn=<{name}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + contents, suffixes, len(prefix), force_newline=t.is_sparse)
