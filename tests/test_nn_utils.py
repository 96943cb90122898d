"""torch.nn.utils helpers that reach ops of their own: weight_norm's fused backward."""
import warnings

import pytest
import torch
from torch.nn.utils import parametrizations

from conftest import check_all_modes

import deferfuse


def _weight_norm_step(d, make, dim):
    torch.manual_seed(0)
    if dim == "old API":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            m = torch.nn.utils.weight_norm(make(), dim=None)
    else:
        m = parametrizations.weight_norm(make(), dim=dim)
    m = m.to(d)
    x = torch.randn(4, 3, 8, 8).to(d) if isinstance(m, torch.nn.Conv2d) else torch.randn(5, 6).to(d)
    (m(x) ** 2).sum().backward()
    return [p.grad for p in m.parameters()] + [m(x).detach()]


@pytest.mark.parametrize("layer", ["linear", "conv"])
@pytest.mark.parametrize("dim", [0, 1, None, "old API"])
def test_weight_norm_values_and_gradients(layer, dim):
    make = (lambda: torch.nn.Linear(6, 4)) if layer == "linear" else (lambda: torch.nn.Conv2d(3, 5, 3))
    check_all_modes(lambda d: _weight_norm_step(d, make, dim), rtol=1e-4, atol=1e-4)
    assert not deferfuse.metrics()["cpu_fallbacks"]  # _weight_norm_interface_backward is lowered


@pytest.mark.parametrize("how", ["to", "device="])
def test_lazy_modules_initialise_and_train_like_cpu(how):
    """A lazy module's uninitialized parameters could not become tpu tensors: `.to("tpu")` and
    LazyLinear(..., device="tpu") failed. They now stay CPU placeholders until the first forward
    shapes and initialises them, and the module then moves itself."""
    def run(d):
        torch.manual_seed(0)
        kw = {"device": d} if how == "device=" else {}
        model = torch.nn.Sequential(torch.nn.LazyConv2d(4, 3, **kw), torch.nn.LazyBatchNorm2d(**kw), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.LazyLinear(2, **kw))
        if how == "to":
            model = model.to(d)
        x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1)).to(d)
        model(x)  # the dry run that shapes the parameters, before the optimizer sees them
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert all(p.device.type == torch.device(d).type for p in model.parameters())
        return [loss] + [p.detach() for p in model.parameters()] + [b for b in model.buffers()]

    check_all_modes(run)


def test_a_tpu_parameter_reprs_as_a_parameter():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(2, 1).bias
    torch.manual_seed(0)
    tpu = torch.nn.Linear(2, 1).to("tpu").bias
    assert repr(tpu) == repr(cpu).replace("requires_grad=True", "device='tpu:0', requires_grad=True")
    assert repr(tpu).startswith("Parameter containing:\n")


@pytest.mark.parametrize("norm_type", [float("-inf"), 0, float("inf"), 2, 3.0])
@pytest.mark.parametrize("foreach", [None, False])
def test_clip_grad_norm_of_every_norm_type(norm_type, foreach):
    """clip_grad_norm_ computes per-tensor norms with torch._foreach_norm, whose lowering knew
    no -inf (it took sum(|x|**-inf)**0 = 1) nor 0 (a nonzero count) norm."""
    def run(d):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(d)
        m(torch.randn(6, 4).to(d)).pow(2).sum().backward()
        next(m.parameters()).grad[0, 0] = 0.0
        total = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1, norm_type, foreach=foreach)
        return [total, torch._foreach_norm([p.grad for p in m.parameters()], norm_type)] + [p.grad for p in m.parameters()]

    check_all_modes(run)


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
@pytest.mark.parametrize("norm_type", [-1, -2.5, float("-inf"), float("inf")])
def test_foreach_norm_without_an_identity_on_an_empty_tensor_raises_like_cpu(norm_type, mode):
    """CPU refuses the norms with no identity (negative, -inf, inf) of an empty tensor; PyTorch's
    meta kernel checks only inf, and tpu returned inf or failed at the flush for the others."""
    from conftest import check_raises_like_cpu

    check_raises_like_cpu(lambda d: torch._foreach_norm([torch.ones(2).to(d), torch.empty(0).to(d)], norm_type),
                          mode)


def test_foreach_norm_of_negative_order_on_nonempty_tensors():
    check_all_modes(lambda d: torch._foreach_norm([torch.tensor([1.0, 2.0, 4.0]).to(d), torch.ones(3).to(d)], -1))


@pytest.mark.parametrize("op", ["native_batch_norm", "no_training"])
@pytest.mark.parametrize("dtypes", ["float32", "bfloat16_input", "bfloat16"])
def test_batch_norm_outside_training_saves_empty_statistics_like_cpu(op, dtypes):
    """CPU's save_mean and save_invstd are empty outside training, in the parameters' dtype;
    PyTorch's meta kernels said [C]. A training call still updates the running statistics."""
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(4, 3, 5, generator=g), torch.rand(3, generator=g), torch.randn(3, generator=g)
    mean, var = torch.rand(3, generator=g), torch.rand(3, generator=g) + 1
    x = x if dtypes == "float32" else x.bfloat16()
    w, b, mean, var = (t.bfloat16() if dtypes == "bfloat16" else t for t in (w, b, mean, var))

    def run(d):
        args = [t.clone().to(d) for t in (x, w, b, mean, var)]  # training writes the running stats
        if op == "native_batch_norm":
            # training through PyTorch's decomposition, whose saved statistics are float32 for
            # bfloat16 parameters where CPU's are bfloat16: compared in the other dtypes only
            train = torch.ops.aten.native_batch_norm(*args, True, 0.1, 1e-5) if dtypes != "bfloat16" else ()
            return [*torch.ops.aten.native_batch_norm(*args, False, 0.1, 1e-5), *train, args[3], args[4]]
        return [*torch.ops.aten._native_batch_norm_legit_no_training(*args, 0.1, 1e-5)]

    check_all_modes(run, atol=1e-2 if dtypes != "float32" else 1e-5, rtol=1e-2 if dtypes != "float32" else 1e-5)
    assert not deferfuse.metrics()["cpu_fallbacks"]
