"""deferfuse.jax_op: a JAX function as a torch op, recorded and fused like any other, with autograd
from jax.vjp or a vjp of its own (issue 30, item 4)."""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import pytest
import torch

import deferfuse
from conftest import MODES, check_all_modes


@deferfuse.jax_op("dftest_jax::rmsnorm")
def rmsnorm(x, w, *, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rmsnorm_reference(x, w, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


class _Block(torch.nn.Module):
    """Linear -> RMSNorm -> Linear, the norm written in JAX on tpu and in torch on CPU."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, x):
        h = self.up(x).relu()
        h = rmsnorm(h, self.scale) if h.device.type == "tpu" else _rmsnorm_reference(h, self.scale)
        return self.down(h)


def test_a_jax_rmsnorm_in_a_torch_model_matches_cpus_reference():
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(3, 8)

    def run(d):
        m = copy.deepcopy(block).to(d)
        out = m(x.to(d))
        (out * torch.arange(12.0, device=d).reshape(3, 4)).sum().backward()
        return [out, *(p.grad for p in m.parameters())]

    check_all_modes(run)


def test_in_defer_and_fuse_it_runs_in_the_program_of_its_neighbours():
    torch.manual_seed(0)
    m, x = _Block().to("tpu"), torch.randn(3, 8).to("tpu")

    def step():
        with deferfuse.mode():
            m(x).sum().backward()

    rep = deferfuse.explain(step)
    (program,) = rep["fusion"]["largest_programs"]
    assert program["program_sizes"] == [program["ops"]]  # one program for the whole step
    names = program["op_names"]
    assert {"dftest_jax.rmsnorm.default", "dftest_jax.rmsnorm_backward.default", "deferfuse.linear.default"} <= set(names)


@deferfuse.jax_op("dftest_jax::split_scale", outputs=2,
                  vjp=lambda x, s, g_lo, g_hi: (jnp.concatenate([g_lo, g_hi * 2.0], -1) * s, jnp.sum(x * 0.0) + 7.0))
def split_scale(x, s):
    """Two outputs, and a gradient of its own making (7 for s: not the true one, so the test
    can tell it was used)."""
    half = x.shape[-1] // 2
    return x[..., :half] * s, x[..., half:] * s * 2.0


@pytest.mark.parametrize("mode", MODES)
def test_several_outputs_and_a_vjp_of_its_own(mode):
    x, s = torch.randn(2, 6), torch.tensor(1.5)
    xt, st = x.to("tpu").requires_grad_(), s.to("tpu").requires_grad_()
    with deferfuse.mode(mode):
        lo, hi = split_scale(xt, st)
        (lo.sum() + hi.sum()).backward()
    torch.testing.assert_close([lo.cpu(), hi.cpu()], [x[:, :3] * s, x[:, 3:] * s * 2])
    torch.testing.assert_close(xt.grad.cpu(), torch.cat([torch.ones(2, 3), torch.full((2, 3), 2.0)], -1) * s)
    assert st.grad.item() == 7.0


def test_an_attribute_is_static_and_each_value_its_own_program():
    x, w = torch.randn(2, 8), torch.ones(8)
    for eps in (1e-6, 10.0):
        check_all_modes(lambda d: rmsnorm(x.to(d), w.to(d), eps=eps) if d == "tpu" else _rmsnorm_reference(x, w, eps))


def test_cpu_tensors_are_refused_with_a_clear_message():
    with pytest.raises(RuntimeError, match="runs on tpu tensors only"):
        rmsnorm(torch.ones(2, 8), torch.ones(8))


def test_a_parameter_it_cannot_type_is_refused():
    with pytest.raises(TypeError, match="neither a tensor"):
        deferfuse.jax_op("dftest_jax::bad")(lambda x, *, name="a": x)
