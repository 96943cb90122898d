"""Debug mode's NaN/Inf check (deferfuse/executors/nonfinite.py): a correct program that makes
the NaN or Inf CPU PyTorch makes runs, with a warning naming the op and line; a NaN deferfuse
makes where CPU's result is finite raises at the user's line."""
from __future__ import annotations

import inspect
import traceback
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deferfuse
from deferfuse.lowering import lowering

# An op whose CPU kernel is finite and whose lowering divides by zero: a stand-in for a lowering
# with a numerical bug, which the check exists to catch.
_lib = torch.library.Library("dftest_nan", "DEF")
_lib.define("diverges(Tensor x) -> Tensor")
_lib.impl("diverges", lambda x: x.clone(), "CPU")
torch.library.register_fake("dftest_nan::diverges")(lambda x: torch.empty_like(x))


@lowering(torch.ops.dftest_nan.diverges.default)
def _diverges(x):
    return x / 0.0


def _correct_programs(d):
    """Programs CPU runs to a NaN or Inf, or through one to a finite answer (issue 26's list)."""
    t, x = torch.tensor([0.0, 1.0, 2.0, 3.0]).to(d), torch.tensor([0.5, 1.5, 2.5, 0.2]).to(d)
    empty = torch.zeros(4, dtype=torch.bool).to(d)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "std\\(\\): degrees of freedom")
        warnings.filterwarnings("ignore", "deferfuse: Falling back to CPU")  # Bessel Y0's
        return {
            "PoissonNLLLoss(full=True)": nn.PoissonNLLLoss(full=True)(x, t),  # log(0) masked away: finite
            "LPPool of a negative input": F.lp_pool1d(torch.tensor([[[-1.0, 2.0, -3.0, 4.0]]]).to(d), 1.5, 2),
            "masked mean over an empty mask": (x * empty).sum() / empty.sum(),
            "std of one element": torch.tensor([1.0]).to(d).std(),
            "Bessel Y0 at its pole": torch.special.bessel_y0(torch.tensor([0.0, 1.0]).to(d)),
        }


@pytest.mark.tpu_tolerance(times=4, why="PoissonNLLLoss(full=True)'s Stirling term (XLA:TPU's float32 log): "
                                        "4.3e-5 absolute measured, 3 times")
def test_nan_or_inf_that_cpu_makes_too_warns_once_per_line_and_runs():
    want = _correct_programs("cpu")
    with deferfuse.mode("debug"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = {k: v.cpu() for k, v in _correct_programs("tpu").items()}
        _correct_programs("tpu")  # the same lines again: no second warning
    torch.testing.assert_close(got, want, equal_nan=True)
    ours = [w for w in caught if "as CPU PyTorch does" in str(w.message)]
    assert {str(w.message).split()[2] for w in ours} == {
        "aten.log.default", "aten.pow.Tensor_Scalar", "aten.div.Tensor", "aten.std.correction",
        "aten.special_bessel_y0.default"}
    assert len(ours) == 5
    assert all(w.filename == __file__ for w in ours)


def test_nan_where_cpu_is_finite_raises_at_the_user_line():
    x = torch.ones(3, device="tpu")
    with deferfuse.mode("debug"):
        line = inspect.currentframe().f_lineno + 2
        with pytest.raises(RuntimeError, match="where CPU PyTorch's result is finite") as info:
            torch.ops.dftest_nan.diverges(x)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert any(f.filename == __file__ and f.lineno == line for f in frames)
    assert torch.isinf(torch.ops.dftest_nan.diverges(x).cpu()).all()  # Strict: no check


def test_raise_setting_raises_on_every_nan_from_finite_inputs(monkeypatch):
    monkeypatch.setattr(deferfuse.CONFIG, "debug_nan_check", "raise")
    with deferfuse.mode("debug"), pytest.raises(RuntimeError, match="DEFERFUSE_DEBUG_NAN_CHECK=raise"):
        torch.log(torch.tensor([-1.0], device="tpu"))


def test_nan_already_in_the_inputs_is_not_reported_again(monkeypatch):
    monkeypatch.setattr(deferfuse.CONFIG, "debug_nan_check", "raise")
    with deferfuse.mode("debug"):
        nan = torch.tensor([float("nan"), 1.0], device="tpu")
        y = nan * 2 + 1
    assert torch.isnan(y.cpu()[0])


def test_the_check_compares_with_cpu_over_the_inputs_before_an_in_place_op():
    """An in-place op replaces its input: CPU reruns it over the values it had before."""
    x = torch.tensor([1.0, 4.0], device="tpu")
    with deferfuse.mode("debug"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x.sub_(1.0).log_()
    assert [str(w.message).split()[2] for w in caught] == ["aten.log_.default"]
    assert x.cpu()[0] == float("-inf")


def test_settings_read_from_the_environment(monkeypatch):
    from deferfuse.config import Config

    for raw, want in (("raise", "raise"), ("1", True), ("0", False), ("warn", None)):
        monkeypatch.setenv("DEFERFUSE_DEBUG_NAN_CHECK", raw)
        if want is None:
            with pytest.raises(ValueError, match="DEFERFUSE_DEBUG_NAN_CHECK"):
                Config()
        else:
            assert Config().debug_nan_check == want
