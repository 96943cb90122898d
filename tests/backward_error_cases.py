"""Exceptions raised inside a backward pass, run on CPU and on tpu in each mode.

Run by test_backward_errors.py in a subprocess of its own: before backward.py, each of these
aborted the process (std::terminate), which would take the test session down with it. Prints
one JSON object: case -> device/mode -> what backward raised and which gradients it left.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.utils.checkpoint

import deferfuse
from deferfuse.routes import lowered


class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _module(d):
    torch.manual_seed(0)
    return torch.nn.Linear(3, 3).to(d)


def tensor_hook(d, x):
    y = x * 2
    y.register_hook(lambda g: {}["missing"])
    y.sum().backward()


def post_accumulate_hook(d, x):
    x.register_post_accumulate_grad_hook(lambda p: 1 / 0)
    (x * 2).sum().backward()


def module_hook(d, x):
    m = _module(d)
    m.register_full_backward_hook(lambda mod, gi, go: [][1])
    m(x).sum().backward()


def module_pre_hook(d, x):
    m = _module(d)
    m.register_full_backward_pre_hook(lambda mod, go: int("x"))
    m(x).sum().backward()


def module_hook_wrong_count(d, x):  # PyTorch's own error, raised in its hook machinery
    m = _module(d)
    m.register_full_backward_hook(lambda mod, gi, go: (None, None))
    m(x).sum().backward()


def function_node_hook(d, x):
    y = Twice.apply(x)
    y.grad_fn.register_hook(lambda gi, go: 1 / 0)
    y.sum().backward()


def multi_grad_hook(d, x):
    a, b = x * 2, x * 3
    torch.autograd.graph.register_multi_grad_hook((a, b), lambda grads: 1 / 0)
    (a.sum() + b.sum()).backward()


def autograd_grad(d, x):
    y = x * 3
    y.register_hook(lambda g: 1 / 0)
    torch.autograd.grad(y.sum(), [x])


def tpu_op_in_hook(d, x):  # a tpu op failing in the user's own code propagates through it
    y = x * 2
    y.register_hook(lambda g: g.view(7))
    y.sum().backward()


def keyboard_interrupt(d, x):
    def hook(g):
        raise KeyboardInterrupt

    y = x * 2
    y.register_hook(hook)
    y.sum().backward()


def second_order(d, x):
    (g,) = torch.autograd.grad((x ** 3).sum(), [x], create_graph=True)
    g.register_hook(lambda g: 1 / 0)
    g.sum().backward()


def saved_tensors_unpack_hook(d, x):
    def unpack(t):
        raise ValueError("cannot unpack")

    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        y = (x * x).sum()
    y.backward()


def checkpoint_recompute_fails(d, x):  # torch.utils.checkpoint recomputes in an unpack hook
    calls = []

    def block(a):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("recomputation failed")
        return (a * a).sin()

    torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).sum().backward()


CASES = [tensor_hook, post_accumulate_hook, module_hook, module_pre_hook, module_hook_wrong_count,
         function_node_hook, multi_grad_hook, autograd_grad, tpu_op_in_hook, keyboard_interrupt, second_order,
         saved_tensors_unpack_hook, checkpoint_recompute_fails]


def outcome(fn, d: str) -> dict:
    x = torch.ones(3, device=d, requires_grad=True)
    try:
        fn(d, x)
        raised = None
    except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt is one of the cases
        raised = [type(e).__name__, str(e)]
    return {"raised": raised, "grad": None if x.grad is None else x.grad.cpu().tolist()}


def failing_backward_formula() -> dict:
    """A tpu op that a backward formula (C++) calls fails: mul raises for the calls made inside
    backward. Nothing of the pass is written, and the next backward works."""
    emit = lowered.emit

    def failing(r, *args):
        if torch._C._current_graph_task_id() >= 0 and r.op.name == "aten.mul.Tensor":
            raise IndexError("simulated failure")
        return emit(r, *args)

    x = torch.ones(3, device="tpu", requires_grad=True)
    w = torch.full((3,), 2.0, device="tpu", requires_grad=True)
    loss = (x * w).sum() + w.sum()
    lowered.emit = failing
    try:
        loss.backward()
        raised = None
    except IndexError as e:
        raised = str(e)
    finally:
        lowered.emit = emit
    left = [x.grad, w.grad]
    (x * w).sum().backward()
    return {"raised": raised, "left": [g is None for g in left], "after": [x.grad.cpu().tolist(), w.grad.cpu().tolist()]}


def main() -> None:
    out = {}
    for fn in CASES:
        out[fn.__name__] = {"cpu": outcome(fn, "cpu")}
        for mode in sys.argv[1:]:
            with deferfuse.mode(mode):
                out[fn.__name__][mode] = outcome(fn, "tpu")
    for mode in sys.argv[1:]:
        with deferfuse.mode(mode):
            out.setdefault("failing_backward_formula", {})[mode] = failing_backward_formula()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
