"""Float32 matmul precision (deferfuse/precision.py): PyTorch's setting reaches every contraction
XLA compiles for tpu, as the precision in its StableHLO, and is part of every cache key.

The StableHLO is JAX's own dump of each module it lowers for compilation (`jax_dump_ir_to`), so
the tests read what XLA was given, whichever deferfuse cache built it; a program served from a
cache is not lowered again and dumps nothing.
"""
from __future__ import annotations

import itertools
import os
import re

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES
from deferfuse.precision import current

XLA = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}
SETTINGS = list(XLA)
# a dot_general prints `precision = [A, B]`, a convolution `precision_config = [#stablehlo<precision A>, ...]`
_CONTRACTION = re.compile(r"stablehlo\.(dot_general|convolution)\b.*")
_PRECISION = re.compile(r"precision(?:_config)? = \[([^\]]*)\]")
_SIZES = itertools.count(5)  # a shape no earlier test compiled, so each case compiles


@pytest.fixture(autouse=True)
def _keep_torch_setting():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.fixture
def compiled(tmp_path):
    """compiled() -> the precisions (XLA's names) of each contraction in the modules lowered since
    the last call, one list per module that has any."""
    old = jax.config.values["jax_dump_ir_to"], jax.config.values["jax_dump_ir_modes"]
    jax.config.update("jax_dump_ir_to", str(tmp_path))
    jax.config.update("jax_dump_ir_modes", "stablehlo")
    seen: set = set()

    def read() -> list[list[str]]:
        deferfuse.sync()
        found = []
        for name in sorted(os.listdir(tmp_path)):
            if name in seen:
                continue
            seen.add(name)
            with open(tmp_path / name) as f:
                lines = [m.group(0) for m in _CONTRACTION.finditer(f.read())]
            if lines:
                found.append([_precision_of(line) for line in lines])
        return found

    try:
        yield read
    finally:
        jax.config.update("jax_dump_ir_to", old[0])
        jax.config.update("jax_dump_ir_modes", old[1])


def _precision_of(line: str) -> str:
    m = _PRECISION.search(line)
    if m is None:
        return "none"  # JAX left the op unmarked
    names = set(re.findall(r"HIGHEST|HIGH|DEFAULT", m.group(1)))
    assert len(names) == 1, line
    return names.pop()


def _only(found: list[list[str]]) -> set:
    assert found, "no program with a contraction was compiled"
    return {p for module in found for p in module}


def _matmul(n):
    a, b = torch.randn(n, n + 1), torch.randn(n + 1, 3)
    return lambda: a.to("tpu") @ b.to("tpu")


def _bmm(n):
    a, b = torch.randn(2, n, 4), torch.randn(2, 4, 3)
    return lambda: torch.bmm(a.to("tpu"), b.to("tpu"))


def _conv(n):
    x, w = torch.randn(1, 2, n, n), torch.randn(3, 2, 3, 3)
    return lambda: F.conv2d(x.to("tpu"), w.to("tpu"))


def _einsum(n):
    a, b = torch.randn(2, n, 4), torch.randn(2, 4, 3)
    return lambda: torch.einsum("bij,bjk->bik", a.to("tpu"), b.to("tpu"))


def _sdpa(n):
    q, k, v = torch.randn(1, 2, n, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    return lambda: F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"))


def _linear_backward(n):
    x, w = torch.randn(n, 4), torch.randn(3, 4)

    def step():
        wt = w.to("tpu").requires_grad_()
        F.linear(x.to("tpu"), wt).sum().backward()
        return wt.grad

    return step


def _conv_backward(n):
    x, w = torch.randn(1, 2, n, n), torch.randn(3, 2, 3, 3)

    def step():
        xt = x.to("tpu").requires_grad_()
        F.conv2d(xt, w.to("tpu")).sum().backward()
        return xt.grad

    return step


OPS = {"matmul": _matmul, "bmm": _bmm, "conv2d": _conv, "einsum": _einsum, "sdpa": _sdpa,
       "linear_backward": _linear_backward, "conv2d_backward": _conv_backward}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("setting", SETTINGS)
def test_every_contraction_compiles_at_the_torch_setting(compiled, mode, op, setting):
    run = OPS[op](next(_SIZES))
    torch.set_float32_matmul_precision(setting)
    with deferfuse.mode(mode):
        run().cpu()  # a result nobody reads is never computed
    assert _only(compiled()) == {XLA[setting]}


@pytest.mark.parametrize("mode", MODES)
def test_settings_never_share_a_cache_entry(compiled, mode):
    run = _matmul(next(_SIZES))
    results = {}
    with deferfuse.mode(mode):
        for setting in SETTINGS:
            torch.set_float32_matmul_precision(setting)
            misses = deferfuse.metrics()["cache_misses"]
            results[setting] = run().cpu()
            assert deferfuse.metrics()["cache_misses"] > misses, setting
            assert _only(compiled()) == {XLA[setting]}
        # back to the first setting: its program again, from the cache
        torch.set_float32_matmul_precision(SETTINGS[0])
        hits, misses = deferfuse.metrics()["cache_hits"], deferfuse.metrics()["cache_misses"]
        again = run().cpu()
        assert deferfuse.metrics()["cache_misses"] == misses
        assert deferfuse.metrics()["cache_hits"] > hits
    assert compiled() == []
    torch.testing.assert_close(again, results[SETTINGS[0]], rtol=0, atol=0)


def test_a_kept_expansion_follows_the_setting(compiled):
    # _addmm_activation (addmm, then relu) is recorded as one kept expansion (expansion.py) after
    # its first call; a later call under another setting must not replay the one traced at the first
    n = next(_SIZES)
    bias, a, b = torch.randn(3), torch.randn(n, 4), torch.randn(4, 3)
    seen = set()
    with deferfuse.mode():
        for setting in ["highest", "highest", "medium", "medium", "highest", "high"]:
            torch.set_float32_matmul_precision(setting)
            torch._addmm_activation(bias.to("tpu"), a.to("tpu"), b.to("tpu")).cpu()
            found = compiled()
            # the expanded call and the kept one are two programs; a first call under a setting
            # compiles, and whatever compiles has the setting's precision
            assert setting in seen or found, setting
            assert {p for module in found for p in module} <= {XLA[setting]}, setting
            seen.add(setting)
    assert deferfuse.metrics()["decompositions_replayed"], "never replayed as its kept expansion"


def test_each_op_keeps_the_setting_it_was_recorded_under(compiled):
    # one DeferAndFuse flush, two matmuls recorded under different settings
    n = next(_SIZES)
    a, b = torch.randn(n, n).to("tpu"), torch.randn(n, n).to("tpu")
    torch.set_float32_matmul_precision("highest")
    with deferfuse.mode():
        x = a @ b
        with deferfuse.precision("medium"):
            y = x @ b
        z = y @ b
    z.cpu()
    found = compiled()
    assert len(found) == 1 and sorted(found[0]) == sorted(["HIGHEST", "DEFAULT", "HIGHEST"])


def test_the_scope_overrides_and_restores_even_on_an_exception(compiled):
    torch.set_float32_matmul_precision("high")
    run = _matmul(next(_SIZES))
    with deferfuse.mode():
        with torch.tpu.precision("medium"):
            assert current() == "medium"
            assert torch.get_float32_matmul_precision() == "high"  # CPU code in the block keeps its own
            run().cpu()
        assert _only(compiled()) == {"DEFAULT"}
        with pytest.raises(KeyError):
            with deferfuse.precision("highest"):
                with deferfuse.precision("medium"):
                    raise KeyError("inside")
        assert current() == "high"
        run().cpu()
    assert _only(compiled()) == {"HIGH"}


def test_the_scope_is_the_same_api_and_refuses_unknown_names():
    assert torch.tpu.precision is deferfuse.precision
    with pytest.raises(ValueError, match="highest"):
        deferfuse.precision("tf32")
    assert current() == torch.get_float32_matmul_precision()


def test_a_jax_op_follows_the_setting(compiled):
    @deferfuse.jax_op("precision_test::project")
    def project(x, w):
        return jnp.dot(x, w)

    x, w = torch.randn(next(_SIZES), 4), torch.randn(4, 3)
    for setting in ["medium", "highest"]:
        torch.set_float32_matmul_precision(setting)
        with deferfuse.mode():
            project(x.to("tpu"), w.to("tpu")).cpu()
        assert _only(compiled()) == {XLA[setting]}


def test_a_recompile_says_the_precision_changed(events):
    run = _matmul(next(_SIZES))
    with deferfuse.mode():
        for setting in ["highest", "medium"]:
            torch.set_float32_matmul_precision(setting)
            run().cpu()
    whys = [e.get("why") for e in events() if e["kind"] == "compile"]
    assert whys[-1] is not None and whys[-1]["what"] == "precision", whys
    assert (whys[-1]["before"], whys[-1]["now"]) == ("highest", "medium")
