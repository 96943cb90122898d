"""Jaxpr rewrites applied to every group program (deferfuse/passes.py)."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax import lax

import deferfuse
from deferfuse import passes
from deferfuse.cache import plans


def _dot_dims(fn, *args):
    return [e.params["dimension_numbers"] for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns
            if e.primitive.name == "dot_general"]


@pytest.mark.xla_cpu
def test_weight_transpose_is_read_in_place():
    x = jnp.arange(6.0).reshape(2, 3)
    w = jnp.arange(12.0).reshape(4, 3)
    f = passes.fold_transposes(lambda x, w: x @ w.T)
    assert _dot_dims(f, x, w) == [(((1,), (1,)), ((), ()))]
    np.testing.assert_array_equal(jax.jit(f)(x, w), x @ w.T)
    # XLA:CPU then runs a matrix kernel on the weight as stored, with no transposed copy
    hlo = jax.jit(f).lower(x, w).compile().as_text()
    assert "transpose" not in hlo[hlo.index("ENTRY"):]


def test_both_operands_and_batch_dimensions():
    a = jnp.arange(24.0).reshape(2, 4, 3)
    b = jnp.arange(30.0).reshape(2, 5, 3)

    def f(a, b):  # (a^T)^T @ b^T per batch, written with transposes of both
        return jnp.matmul(jnp.swapaxes(jnp.swapaxes(a, 1, 2), 1, 2), jnp.swapaxes(b, 1, 2))

    g = passes.fold_transposes(f)
    np.testing.assert_array_equal(jax.jit(g)(a, b), f(a, b))
    (lc, rc), (lb, rb) = _dot_dims(g, a, b)[0]
    assert rc == (2,) and lb == (0,) and rb == (0,)


def test_transpose_that_reorders_free_dimensions_stays():
    # the product lists lhs free dims in lhs order: folding this permutation would transpose the output
    x = jnp.arange(24.0).reshape(2, 3, 4)

    def f(x):
        t = lax.transpose(x, (1, 0, 2))  # (3, 2, 4): free dims 3 and 2 swap order
        return lax.dot_general(t, jnp.ones((4, 5)), (((2,), (0,)), ((), ())))

    g = passes.fold_transposes(f)
    assert _dot_dims(g, x) == _dot_dims(f, x)
    np.testing.assert_array_equal(jax.jit(g)(x), f(x))


def test_pytree_arguments_and_results_pass_through():
    def f(inputs, scalars):
        return [inputs[0] @ inputs[1].T * scalars[0], inputs[1].sum()]

    ins = [jnp.ones((2, 3)), jnp.arange(12.0).reshape(4, 3)]
    got = jax.jit(passes.fold_transposes(f))(ins, [2.0])
    want = f(ins, [2.0])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_linear_layers_match_cpu_in_every_mode():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16)
    want = lin(x)
    dev = torch.nn.Linear(16, 8).to("tpu")
    dev.load_state_dict(lin.state_dict())
    for kind in ("strict", "defer_and_fuse"):
        with deferfuse.mode(kind):
            got = dev(x.to("tpu"))
            got_t = x.to("tpu") @ dev.weight.t()
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(got_t.cpu(), x @ lin.weight.t())


@pytest.mark.xla_cpu
def test_the_fold_runs_for_xla_cpu_alone(monkeypatch):
    """Other backends lay out matrix operands themselves: the pass would only trace each program
    twice, seconds per compile and per persistent-cache load on a TPU host."""
    def fn(ins, scs):
        return ins

    assert getattr(plans._rewritten(fn), "unfolded", None) is fn  # this machine's CPU backend
    monkeypatch.setattr(plans, "jax_device", lambda: SimpleNamespace(platform="tpu"))
    assert plans._rewritten(fn) is fn
