"""Teaching Dynamo that a tpu tensor is a plain device tensor.

`TpuTensor` overrides `__torch_dispatch__` and is not a traceable wrapper subclass, so Dynamo
would model it as an arbitrary Python object, break the graph at its first op and trace into
deferfuse's dispatcher and JAX. Four changes make it an ordinary tensor to Dynamo and
AOTAutograd, fakeified as a FakeTensor on tpu:0 over PyTorch's meta kernels:

- Dynamo wraps a `TpuTensor` as it wraps `torch.Tensor` (a `TensorVariable`, no subclass type);
- deferfuse, jax and jaxlib are in Dynamo's skip rules: their frames are never traced;
- `TpuTensor.__coerce_same_metadata_as_tangent__` (tensor.py) answers AOTAutograd's check of
  the tangents a compiled backward receives;
- `torch.Generator(device="tpu")` is wrapped as a generator, as a CPU one is;
- `torch.tensor(data, device="tpu")` is traced as the tensor made on the CPU and moved with
  `.to(device)`. PyTorch makes such a tensor on its device below the dispatch modes and then
  lifts it; the fake and proxy modes take a plain device tensor there for a constant, but leave a
  tpu tensor, a subclass to them, to its own dispatch: a real tensor among the graph's fake ones,
  and Dynamo failed on it (every Hugging Face decoder's `DynamicCache` makes one).

And one for optimizers: Dynamo makes an optimizer whose state is not created yet `capturable`
(its step counts on the device, so a compiled step is one program without host scalars) for CUDA
and XPU parameters only; tpu parameters get the same, so the default AdamW/Adam/SGD compile to
programs that replay.
"""
from __future__ import annotations

import torch
from torch._dynamo import trace_rules
from torch._dynamo.variables import builder
from torch._dynamo.variables.optimizer import OptimizerVariable
from torch._dynamo.variables.torch import TorchInGraphFunctionVariable
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_map_only

from ..lowering.linalg import grouped_mm_meta
from ..rng import TpuGenerator
from ..tensor import TpuTensor

SKIPPED = ("deferfuse", "jax", "jaxlib", "ml_dtypes")
_done = [False]


def teach() -> None:
    if _done[0]:
        return
    _done[0] = True
    for name in SKIPPED:
        trace_rules.add(name)
    vb = builder.VariableBuilder
    type_dispatch = vb._type_dispatch.__func__

    def _type_dispatch(cls):
        table = type_dispatch(cls)  # cached by Dynamo: the entry is added once per table
        if TpuTensor not in table:
            table[TpuTensor] = cls.wrap_tensor
            # a generator of device "tpu" is a torch._C.Generator subclass, which Dynamo would take
            # for an opaque script object and fail on in a fake call: as a generator, a random
            # op given it is a graceful graph break that runs eagerly and draws from it
            table[TpuGenerator] = cls.wrap_user_defined
        return table

    vb._type_dispatch = classmethod(_type_dispatch)
    infer = builder.infer_subclass_type

    def infer_subclass_type(value):
        return None if type(value) is TpuTensor else infer(value)

    builder.infer_subclass_type = infer_subclass_type
    set_capturable = OptimizerVariable._set_capturable
    init = OptimizerVariable.__init__

    def _set_capturable(self, tx):
        _capturable_on_tpu(self.value)
        return set_capturable(self, tx)

    def __init__(self, value, *args, **kwargs):
        # also here: a retrace that reads the groups without asking for `param_groups` first
        # (a recompile of the step's resume function) must see the flag too
        _capturable_on_tpu(value)
        init(self, value, *args, **kwargs)

    OptimizerVariable.__init__ = __init__
    OptimizerVariable._set_capturable = _set_capturable
    handlers = TorchInGraphFunctionVariable._get_handlers()  # cached by Dynamo: one dict, kept
    handlers[torch.tensor] = _tensor_via_cpu(handlers[torch.tensor])
    fake_impls.register_op_impl(lambda func: func is _GROUPED_MM)(_grouped_mm_on_tpu)


_GROUPED_MM = torch.ops.aten._grouped_mm.default


def _grouped_mm_on_tpu(fake_mode, func, *args, **kwargs):
    """`_grouped_mm` of tpu tensors in a fake trace, by deferfuse's own rule (lowering/linalg.py):
    every floating dtype and layout its lowering takes, as transformers' Mixtral and Qwen-MoE
    call it on tpu, where PyTorch's meta kernel keeps the Hopper kernel's rules (bfloat16 alone,
    rows aligned to 16 bytes)."""
    if args[0].device.type != "tpu":
        return NotImplemented
    meta = grouped_mm_meta(*tree_map_only(torch.Tensor, _as_meta, (args, kwargs)))
    return FakeTensor(fake_mode, meta, args[0].device)


def _as_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _tensor_via_cpu(handle):
    """Dynamo's handler for `torch.tensor`, which makes a tensor for tpu on the CPU first."""

    def handler(self, tx, *args, **kwargs):
        device = kwargs.get("device")
        if device is not None and "requires_grad" not in kwargs and device.is_python_constant() \
                and torch.device(device.as_python_constant()).type == "tpu":
            on_cpu = self.call_function(tx, list(args), {k: v for k, v in kwargs.items() if k != "device"})
            return on_cpu.call_method(tx, "to", [device], {})
        return handle(self, tx, *args, **kwargs)

    return handler


def _capturable_on_tpu(opt) -> None:
    """Dynamo's rule for CUDA, for tpu: a group of tpu parameters whose state is not created yet
    becomes capturable (a fused step keeps its own step counts on the device already)."""
    for group in opt.param_groups:
        params = group.get("params", [])
        if ("capturable" in group and not group.get("fused") and params
                and all(type(p) is TpuTensor for p in params) and not any(p in opt.state for p in params)):
            group["capturable"] = True
