"""F.linear claimed at its autograd key (deferfuse/lowering/linear.py): one node forward, one
backward, the same values and gradients as CPU, and PyTorch's own behaviour everywhere else."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES, check_all_modes


@pytest.mark.parametrize("shape", [(4,), (5, 4), (2, 3, 4)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_linear_values_and_gradients_match_cpu(shape, bias, dtype):
    torch.manual_seed(0)
    x0 = torch.randn(shape, dtype=dtype)
    w0 = torch.randn(3, 4, dtype=dtype)
    b0 = torch.randn(3, dtype=dtype) if bias else None

    def fn(dev):
        x, w = x0.detach().to(dev).requires_grad_(), w0.detach().to(dev).requires_grad_()
        b = b0.detach().to(dev).requires_grad_() if bias else None
        y = F.linear(x, w, b)
        weights = torch.arange(y.numel(), dtype=dtype, device=dev).reshape(y.shape)
        (y * weights).sum().backward()
        return [y, x.grad, w.grad] + ([b.grad] if bias else [])

    # half types: CPU rounds (y * weights) and its sum's pieces to the half type at steps XLA
    # may fuse away, so values agree to the half type's resolution
    check_all_modes(fn, **({} if dtype in (torch.float32, torch.float64) else dict(rtol=2e-2, atol=5e-2)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_records_one_node_forward_and_one_backward(dtype):
    # without the claim, PyTorch's expansion records addmm forward (its views record nothing) and
    # mm, mm and sum backward
    lin = torch.nn.Linear(4, 3).to("tpu", dtype)
    x = torch.randn(2, 3, 4).to("tpu", dtype).requires_grad_()
    with deferfuse.mode():
        before = deferfuse.metrics()["ops_recorded"]
        y = lin(x)
        forward = deferfuse.metrics()["ops_recorded"] - before
        g = torch.ones(2, 3, 3, device="tpu", dtype=dtype)
        before = deferfuse.metrics()["ops_recorded"]
        y.backward(g)
        backward = deferfuse.metrics()["ops_recorded"] - before
    assert forward == 1
    assert backward == 1  # x, weight and bias gradients from one node
    assert x.grad is not None and lin.weight.grad is not None and lin.bias.grad is not None


def test_only_the_gradients_asked_for_are_returned():
    def fn(dev):
        x = torch.arange(8.0, device=dev).reshape(2, 4)  # no grad
        w = torch.ones(3, 4, device=dev).requires_grad_()
        F.linear(x, w).sum().backward()
        return [w.grad, torch.tensor(x.grad is None)]

    check_all_modes(fn)


def test_double_backward_matches_cpu():
    torch.manual_seed(0)
    x0, w0, b0 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)

    def fn(dev):
        x, w, b = (t.detach().to(dev).requires_grad_() for t in (x0, w0, b0))
        y = F.linear(x, w, b)
        gx, gw = torch.autograd.grad((y ** 2).sum(), (x, w), create_graph=True)
        penalty = (gx ** 2).sum() + (gw ** 3).sum()
        return [penalty] + list(torch.autograd.grad(penalty, (x, w, b)))

    check_all_modes(fn)


def test_double_backward_with_one_tensor_in_two_arguments():
    """F.linear(x, x) under create_graph=True: each argument slot gets its own gradient, which
    autograd sums into x; the whole gradient was returned for both, doubling it."""
    torch.manual_seed(0)
    x0 = torch.randn(3, 3, dtype=torch.float64)

    def fn(dev):
        x = x0.detach().to(dev).requires_grad_()
        gx, = torch.autograd.grad(F.linear(x, x).pow(2).sum(), x, create_graph=True)
        return [gx] + list(torch.autograd.grad(gx.pow(2).sum(), x))

    check_all_modes(fn)


def test_unclaimed_calls_behave_as_before():
    """Integer tensors, a broadcast bias and bad shapes go to PyTorch's own expansion."""
    torch.manual_seed(0)
    x, w = torch.randn(2, 4), torch.randn(3, 4)

    def fn(dev):
        integer = F.linear(torch.arange(8).reshape(2, 4).to(dev), torch.arange(12).reshape(3, 4).to(dev))
        wide_bias = F.linear(x.to(dev), w.to(dev), torch.ones(2, 3).to(dev))
        return [integer, wide_bias]

    check_all_modes(fn, atol=1e-2, rtol=1e-2)
    with pytest.raises(RuntimeError):
        F.linear(torch.randn(2, 5).to("tpu"), torch.randn(3, 4).to("tpu"))


_MIXED = {
    "mm": (torch.mm, [(2, 3), (3, 4)], 1),
    "mv": (torch.mv, [(2, 3), (3,)], 1),
    "addmm": (torch.addmm, [(2, 4), (2, 3), (3, 4)], 0),
    "addbmm": (torch.addbmm, [(2, 4), (2, 2, 3), (2, 3, 4)], 1),
    "matmul": (torch.matmul, [(2, 3), (3, 4)], 1),
    "linear": (F.linear, [(2, 4), (3, 4)], 1),
}


@pytest.mark.parametrize("name", sorted(_MIXED))
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_matrix_products_refuse_mixed_dtypes_like_cpu(name, mode):
    """The meta kernels promote float32 @ float64; CPU raises, and so must tpu (not compute)."""
    fn, shapes, odd = _MIXED[name]
    args = [torch.ones(s, dtype=torch.float64 if k == odd else torch.float32) for k, s in enumerate(shapes)]
    with pytest.raises(RuntimeError) as cpu:
        fn(*args)
    with deferfuse.mode(mode):
        pending = torch.ones(3, device="tpu") * 2
        with pytest.raises(RuntimeError) as tpu:
            fn(*[a.to("tpu") for a in args])
        assert pending.sum().item() == 6.0
    assert str(tpu.value) == str(cpu.value)


def test_claimed_ops_under_functorch_grad_match_cpu():
    """torch.func transforms need new-style autograd Functions; the claimed linear and attention
    hand calls under them to PyTorch's expansion (attention raised here before)."""
    torch.manual_seed(0)
    q0, w0 = torch.randn(1, 2, 4, 8), torch.randn(3, 8)

    def loss(q, w):
        y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return F.linear(y, w).sum()

    expected = torch.func.grad(loss, argnums=(0, 1))(q0, w0)
    got = torch.func.grad(loss, argnums=(0, 1))(q0.to("tpu"), w0.to("tpu"))
    torch.testing.assert_close([g.cpu() for g in got], list(expected), atol=1e-4, rtol=1e-4)


def _update_between_forward_and_backward(d, input_grad):
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2).to(d)
    x = torch.randn(4, 3).to(d).requires_grad_(input_grad)
    y = m(x).sum()
    with torch.no_grad():
        m.weight.add_(1.0)  # clipping or an average between forward and backward
        m.bias.mul_(2.0)
    y.backward()
    return [m.weight.grad, m.bias.grad]


def test_an_in_place_change_backward_does_not_need_is_allowed_like_cpu():
    """With no gradient wanted for the input, CPU saves neither the weight nor the bias; the
    claimed layer saved both and raised 'modified by an inplace operation'."""
    check_all_modes(lambda d: _update_between_forward_and_backward(d, False))


@pytest.mark.parametrize("mode", MODES)
def test_an_in_place_change_backward_needs_still_raises(mode):
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _update_between_forward_and_backward("cpu", True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with deferfuse.mode(mode):
            _update_between_forward_and_backward("tpu", True)


@pytest.mark.parametrize("needs", ["all", "weights only"])
def test_a_compiled_linear_holds_the_claims_nodes_and_matches_cpu(monkeypatch, needs):
    """Under torch.compile the layer's graphs hold the same two nodes as eager (so the weight
    gradient lowers to the same program), with CPU's values and only the gradients asked for."""
    from deferfuse.compiler import graphs

    torch._dynamo.reset()
    targets = []
    init = graphs.CompiledGraph.__init__

    def keep(self, gm, kind):
        init(self, gm, kind)
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")

    monkeypatch.setattr(graphs.CompiledGraph, "__init__", keep)
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3)
    x0 = torch.randn(2, 5, 4)

    def step(m, x):
        y = m(x)
        (y * y).sum().backward()
        return y

    def run(dev, fn):
        m = torch.nn.Linear(4, 3).to(dev)
        m.load_state_dict(ref.state_dict())
        x = x0.to(dev).requires_grad_(needs == "all")
        y = fn(m, x)
        return [y, m.weight.grad, m.bias.grad] + ([x.grad] if needs == "all" else [])

    got = run("tpu", torch.compile(step, backend="tpu"))
    expected = run("cpu", step)
    torch.testing.assert_close([t.cpu() for t in got], expected, rtol=1e-5, atol=1e-5)
    assert "deferfuse.linear.default" in targets and "deferfuse.linear_backward.default" in targets
    assert "aten.mm.default" not in targets and "aten.addmm.default" not in targets
    torch._dynamo.reset()
