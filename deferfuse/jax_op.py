"""JAX functions as torch ops: `@deferfuse.jax_op("mylib::rmsnorm")`.

A hand-written kernel, a Pallas call or a `jax.numpy` routine becomes a `torch.library` custom op
that deferfuse lowers to the function itself. Called on tpu tensors it records one node, which
the fuser places in the program of the ops around it: the function is traced into that XLA
program, as TorchTPU's `jax_op` is. Strict runs it at once, like any op. Its output shapes come
from `jax.eval_shape` (the op's fake kernel), so torch knows them without running anything; it
has no CPU kernel, and says so on CPU tensors.

Autograd: `vjp=` gives the gradient as a JAX function `vjp(*inputs, *grads, **attributes) ->
one gradient per input`; without it, `jax.vjp` of the function does. The backward is an op of
its own, `<name>_backward`, recorded and fused the same way.

The signature is read from the Python function: each positional parameter is a tensor, each
keyword-only one with a default an attribute (bool, int or float, by its default's type), which
is static: a new value traces a new program.
"""
from __future__ import annotations

import inspect
from typing import Callable, Sequence

import jax
import torch

from .dtypes import to_jax_dtype, to_torch_dtype
from .lowering.registry import lowering

_SCHEMA_TYPES = {bool: "bool", int: "int", float: "float"}
_LIBS: dict[str, torch.library.Library] = {}


def jax_op(name: str, *, outputs: int = 1, vjp: Callable | None = None) -> Callable[[Callable], Callable]:
    """Register a JAX function as the torch op `name` ("namespace::op"); returns the op, callable
    with torch tensors. `outputs`: how many tensors it returns (one, or a tuple of that many)."""
    namespace, op_name = name.split("::")

    def register(fn: Callable) -> Callable:
        tensors, attrs = _parameters(fn)
        lib = _LIBS.get(namespace) or _LIBS.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
        out = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"
        attr_schema = "".join(f", {_SCHEMA_TYPES[type(d)]} {a}={d!r}" for a, d in attrs.items())
        lib.define(f"{op_name}({', '.join(f'Tensor {t}' for t in tensors)}{', *' if attrs else ''}{attr_schema}) -> {out}")
        grads = ", ".join(f"Tensor grad{k}" for k in range(outputs))
        back = "(" + ", ".join(["Tensor"] * len(tensors)) + ")" if len(tensors) > 1 else "Tensor"
        lib.define(f"{op_name}_backward({', '.join(f'Tensor {t}' for t in tensors)}, {grads}"
                   f"{', *' if attrs else ''}{attr_schema}) -> {back}")
        op = getattr(getattr(torch.ops, namespace), op_name).default
        backward_op = getattr(getattr(torch.ops, namespace), op_name + "_backward").default
        backward = vjp or _autodiff(fn, len(tensors), outputs)

        lib.impl(op_name, _no_cpu_kernel(name), "CPU")
        lib.impl(op_name + "_backward", _no_cpu_kernel(name + "_backward"), "CPU")
        torch.library.register_fake(name, _fake(fn), lib=lib)
        torch.library.register_fake(name + "_backward", _fake(backward), lib=lib)
        # its dots follow torch's float32 matmul precision, as every tpu contraction does
        lowering(op, family="misc", precision=True)(_lowered(fn, len(tensors)))
        lowering(backward_op, family="misc", precision=True)(_lowered(backward, len(tensors) + outputs))
        torch.library.register_autograd(name, _backward(backward_op, len(tensors)), lib=lib,
                                        setup_context=_save_inputs(len(tensors)))
        return op

    return register


def _parameters(fn: Callable) -> tuple[list[str], dict]:
    tensors, attrs = [], {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            tensors.append(p.name)
        elif p.kind is p.KEYWORD_ONLY and type(p.default) in _SCHEMA_TYPES:
            attrs[p.name] = p.default
        else:
            raise TypeError(f"deferfuse.jax_op: parameter {p.name!r} of {fn.__name__} is neither a tensor "
                            "(positional, no default) nor an attribute (keyword-only, a bool/int/float default)")
    return tensors, attrs


def _lowered(fn: Callable, n_tensors: int) -> Callable:
    """The lowering: JAX arrays in schema order, attributes as keywords (static in the key)."""
    def lowered(*args, **attrs):
        return fn(*args[:n_tensors], **attrs)

    lowered.__name__ = getattr(fn, "__name__", "jax_op")
    return lowered


def _fake(fn: Callable) -> Callable:
    """Output shapes and dtypes from `jax.eval_shape`, which traces without computing."""
    def fake(*args, **attrs):
        specs = [jax.ShapeDtypeStruct(tuple(t.shape), to_jax_dtype(t.dtype)) for t in args]
        res = jax.eval_shape(lambda *xs: fn(*xs, **attrs), *specs)
        leaves = res if isinstance(res, (tuple, list)) else (res,)
        made = [args[0].new_empty(tuple(r.shape), dtype=to_torch_dtype(r.dtype)) for r in leaves]
        return made[0] if not isinstance(res, (tuple, list)) else tuple(made)

    return fake


def _autodiff(fn: Callable, n_tensors: int, outputs: int) -> Callable:
    """The gradient by `jax.vjp` of the function: inputs, then one cotangent per output."""
    def backward(*args, **attrs):
        primals, cotangents = args[:n_tensors], args[n_tensors:]
        out, pullback = jax.vjp(lambda *xs: fn(*xs, **attrs), *primals)
        grads = pullback(cotangents[0] if outputs == 1 else tuple(cotangents))
        return grads[0] if n_tensors == 1 else tuple(grads)

    return backward


def _save_inputs(n_tensors: int) -> Callable:
    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        ctx.save_for_backward(*inputs[:n_tensors])
        ctx.attrs = dict(keyword_only_inputs or {})
        outs = output if isinstance(output, (tuple, list)) else (output,)
        ctx.zeros = [(o.shape, o.dtype) for o in outs]  # for an output autograd gives no gradient

    return setup_context


def _backward(backward_op, n_tensors: int) -> Callable:
    def backward(ctx, *grads):
        x = ctx.saved_tensors[0]
        grads = [g if g is not None else x.new_zeros(shape, dtype=dtype) for g, (shape, dtype) in zip(grads, ctx.zeros)]
        res = backward_op(*ctx.saved_tensors, *grads, **ctx.attrs)
        return tuple(res) if n_tensors > 1 else res

    return backward


def _no_cpu_kernel(name: str) -> Callable:
    def refuse(*args: Sequence, **kwargs):
        raise RuntimeError(f"{name} is a JAX function registered with deferfuse.jax_op: it runs on tpu tensors only "
                           "(move its inputs with .to('tpu'))")

    return refuse
