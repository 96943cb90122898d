"""The "tpu" backend of torch.compile: AOTAutograd's ATen graphs lowered by deferfuse's recording path.

Importing this module imports torch._dynamo (about a second), so deferfuse loads it on the first
`torch.compile` call or when Dynamo looks the backend up by name (the `torch_dynamo_backends`
entry point), never at `import deferfuse`.
"""
from __future__ import annotations

import threading

import torch
import torch.fx.passes._tensorify_python_scalars as tensorify
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
from torch._dynamo.callback import callback_handler

from .. import pending
from ..target import NAME
from . import dynamo
from .graphs import CompiledGraph

dynamo.teach()


def _forward(gm, example_inputs):
    return CompiledGraph(gm, "forward")


def _backward(gm, example_inputs):
    return CompiledGraph(gm, "backward")


def _inference(gm, example_inputs):
    return CompiledGraph(gm, "inference")


# In-place updates of inputs stay in an inference graph (an optimizer step, a KV-cache write), so
# they land in the program, not in copies AOTAutograd would run after it op by op
_aot = aot_autograd(fw_compiler=_forward, bw_compiler=_backward, inference_compiler=_inference,
                    keep_inference_input_mutations=True)


_compiling = threading.local()


def _compiled_a_frame(_args) -> None:
    """The frame's tracer is garbage now, in cycles holding its real tensors: the next flush
    collects them first (`pending._flush`)."""
    pending.PENDING.garbage = True


def tpu(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """torch.compile(fn, backend="tpu")."""
    if _compiled_a_frame not in callback_handler.end_callbacks:  # torch._dynamo.reset() clears them
        callback_handler.register_end_callback(_compiled_a_frame)  # runs as this frame's compile ends
    _compiling.depth = getattr(_compiling, "depth", 0) + 1
    try:
        return _aot(gm, example_inputs, **kwargs)
    finally:
        _compiling.depth -= 1


def _keep_python_floats() -> None:
    """A Python float that changes between calls (a learning rate an LR scheduler sets) stays an
    input of the graph, as it does with backend="eager", instead of a constant guarded per value.

    From its second value on Dynamo passes such a float to the graph as a CPU 0-dim tensor read
    by `.item()`. AOTAutograd then runs Inductor's tensorify pass, which rewrites that read into
    tensor math for the few pointwise ops it knows, and for any other use (every `_foreach_*`
    scalar, so a foreach optimizer's `lr`) specializes the float and restarts Dynamo: a guard
    `param_groups[0]['lr'] == value`, a new graph and program every scheduler step. Inductor needs
    that pass because its kernels cannot take a symbolic float; deferfuse's recording takes the
    float as any Python scalar, a program input. So the pass's own switch (PyTorch's
    `TENSORIFY_PYTHON_SCALARS=0`) reads off while this backend compiles, and only then."""
    enabled = tensorify._is_tensorify_enabled
    if getattr(enabled, "_deferfuse", False):
        return

    def _is_tensorify_enabled() -> bool:
        return not getattr(_compiling, "depth", 0) and enabled()

    _is_tensorify_enabled._deferfuse = True
    tensorify._is_tensorify_enabled = _is_tensorify_enabled


_keep_python_floats()


def register() -> None:
    """Make backend="tpu" known to Dynamo (once; the entry point may have done it already)."""
    if NAME not in _COMPILER_FNS:
        register_backend(tpu, NAME)
    _route_inductor()


def on_tpu(example_inputs) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == NAME for x in example_inputs)


def _route_inductor() -> None:
    """Inductor cannot compile tpu tensors: a graph whose inputs are on tpu goes to "tpu" when
    Inductor is asked for, by default or by name (transformers' generate compiles a static-cache
    model with it), as TorchTPU picks its own backend."""
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper.__call__, "_deferfuse", False):
        return
    call = wrapper.__call__

    def __call__(self, model_, inputs_):
        if on_tpu(inputs_):
            return tpu(model_, inputs_)
        return call(self, model_, inputs_)

    __call__._deferfuse = True
    wrapper.__call__ = __call__
