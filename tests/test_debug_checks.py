"""Debug mode's checks (and TORCH_TPU_ENABLE_DEBUG_CHECKS elsewhere): CPU's errors for bad data,
raised at the user's line, and correct programs left alone."""
from __future__ import annotations

import inspect
import os
import traceback

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES, check_all_modes


# --- Debug -------------------------------------------------------------------------------------------


@pytest.fixture(params=["debug", "strict", "defer_and_fuse"])
def checking_mode(request, monkeypatch):
    """Debug, or Strict / DeferAndFuse with TORCH_TPU_ENABLE_DEBUG_CHECKS=1 (its data checks)."""
    mode = request.param
    if mode != "debug":
        monkeypatch.setattr(deferfuse.CONFIG, "debug_checks", True)
        monkeypatch.setattr(deferfuse.modes.EXECUTORS[deferfuse.EagerMode(mode)], "checks_before", True)
    return mode


def test_debug_raises_on_nan_at_user_line(monkeypatch):
    monkeypatch.setattr(deferfuse.CONFIG, "debug_nan_check", "raise")  # CPU's log(-1) is NaN too
    x = torch.tensor([1.0, -1.0]).to("tpu")
    with deferfuse.mode("debug"):
        line = inspect.currentframe().f_lineno + 2
        with pytest.raises(RuntimeError, match="NaN or Inf") as info:
            torch.log(x)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert any(f.filename == __file__ and f.lineno == line for f in frames)


def test_debug_nan_check_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(deferfuse.CONFIG, "debug_nan_check", False)
    with deferfuse.mode("debug"):
        y = torch.log(torch.tensor([-1.0], device="tpu"))
    assert torch.isnan(y.cpu()).all()


def test_debug_does_not_flag_intentional_infinities():
    with deferfuse.mode("debug"):
        scores = torch.zeros(3, 3, device="tpu")
        mask = torch.ones(3, 3, device="tpu").triu(1).bool()
        masked = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(masked, dim=-1)
    assert torch.isfinite(probs.cpu()).all()


@pytest.mark.parametrize(
    "call",
    [
        lambda x, i: torch.index_select(x, 0, i),
        lambda x, i: x[i],
        lambda x, i: F.embedding(i, x),
        lambda x, i: torch.gather(x, 0, i.view(-1, 1).expand(-1, 3)),
        lambda x, i: x.index_put((i,), torch.zeros(3, device=x.device)),
        lambda x, i: torch.zeros_like(x).scatter(0, i.view(-1, 1).expand(-1, 3), x[:2]),
        lambda x, i: torch.take(x, i * 2),
        lambda x, i: F.cross_entropy(x[:2], i),
        lambda x, i: F.nll_loss(x[:2], -i, ignore_index=-1),
        lambda x, i: F.cross_entropy(x[:2].reshape(2, 3, 1), i.view(2, 1)),
        lambda x, i: F.one_hot(i, 4),
        lambda x, i: F.one_hot(-i),
    ],
    ids=["index_select", "index", "embedding", "gather", "index_put", "scatter", "take", "cross_entropy",
         "nll_loss_negative", "cross_entropy_2d", "one_hot", "one_hot_negative"],
)
def test_debug_out_of_range_index_raises_like_cpu(call, checking_mode):
    """Debug checks indices (and class targets) on the host and raises CPU's own error; so do
    Strict and DeferAndFuse with TORCH_TPU_ENABLE_DEBUG_CHECKS=1."""
    x = torch.arange(12.0).reshape(4, 3)
    i = torch.tensor([1, 7])
    with pytest.raises(Exception) as cpu_err:
        call(x, i)
    with deferfuse.mode(checking_mode):
        with pytest.raises(type(cpu_err.value)) as err:
            call(x.to("tpu"), i.to("tpu"))
    assert str(err.value) == str(cpu_err.value)


@pytest.mark.parametrize("bad", [1.5, -0.1])
def test_debug_binary_cross_entropy_of_a_non_probability_raises_like_cpu(bad, checking_mode):
    """A logit passed to F.binary_cross_entropy: CPU refuses it; Debug flagged the NaN instead."""
    from conftest import check_raises_like_cpu

    inp, tgt = torch.tensor([0.5, bad]), torch.tensor([1.0, 0.0])
    check_raises_like_cpu(lambda d: F.binary_cross_entropy(inp.to(d), tgt.to(d)), checking_mode)


def test_without_the_debug_checks_strict_and_deferred_read_no_data():
    """Like CUDA, they check no value that only the data can show: an index past the end reads
    some element (XLA clamps), a negative class makes a row of zeros; no sync, no error."""
    x, i = torch.arange(12.0).reshape(4, 3).to("tpu"), torch.tensor([1, 7]).to("tpu")
    for mode in ("strict", "defer_and_fuse"):
        with deferfuse.mode(mode):
            torch.index_select(x, 0, i).cpu()
            assert F.one_hot(-i[:1], 4).cpu().tolist() == [[0, 0, 0, 0]]


@pytest.mark.subprocess
def test_the_debug_checks_follow_the_environment():
    import subprocess
    import sys

    code = ("import torch, deferfuse\n"
            "try:\n"
            "    torch.index_select(torch.ones(3, device='tpu'), 0, torch.tensor([5], device='tpu'))\n"
            "except IndexError as e:\n"
            "    print('raised', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TORCH_TPU_ENABLE_DEBUG_CHECKS": "1"})
    assert out.stdout.startswith("raised index out of range in self"), out.stderr[-1000:]


_INT_DIVISIONS_BY_ZERO = {
    "floordiv": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": lambda a, b: torch.fmod(a, b),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor_": lambda a, b: a.clone().div_(b, rounding_mode="floor"),
    "floordiv_inplace": lambda a, b: a.clone().__ifloordiv__(b),
    "scalar_remainder": lambda a, b: torch.remainder(7, b),
    "fmod_out": lambda a, b: torch.fmod(a, b, out=torch.empty_like(a)),
    "int8": lambda a, b: a.to(torch.int8) // b.to(torch.int8),
}


@pytest.mark.parametrize("call", _INT_DIVISIONS_BY_ZERO.values(), ids=_INT_DIVISIONS_BY_ZERO.keys())
def test_debug_integer_division_by_zero_raises_like_cpu(call, checking_mode):
    """CPU raises RuntimeError("ZeroDivisionError") for an integer divisor tensor holding 0; XLA,
    like CUDA, returns a value, which Strict and DeferAndFuse check only with the debug checks."""
    from conftest import check_raises_like_cpu

    a, b = torch.tensor([5, -3, 4]), torch.tensor([2, 0, 1])
    check_raises_like_cpu(lambda d: call(a.to(d), b.to(d)), checking_mode)


def test_debug_division_checks_leave_valid_divisions_alone():
    """A nonzero integer divisor, a float result (inf as on CPU, left to the NaN check's own
    rules) and true division of integers are not integer divisions by zero."""
    a, b = torch.tensor([5, -3, 4]), torch.tensor([2, -2, 1])
    with deferfuse.mode("debug"):
        got = [a.to("tpu") // b.to("tpu"), a.to("tpu") % b.to("tpu"), torch.fmod(a.to("tpu"), 3),
               torch.div(a.to("tpu"), b.to("tpu"), rounding_mode="trunc")]
    expected = [a // b, a % b, torch.fmod(a, 3), torch.div(a, b, rounding_mode="trunc")]
    for g, e in zip(got, expected):
        assert torch.equal(g.cpu(), e)


_SINGULAR = torch.tensor([[1.0, 2.0], [2.0, 4.0]])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call", [
    lambda a: torch.linalg.inv(a),
    lambda a: torch.inverse(a),
    lambda a: torch.linalg.inv(torch.stack([torch.eye(2, device=a.device), a])),
    lambda a: torch.linalg.solve(a, torch.ones(2, 1, device=a.device)),
    lambda a: torch.linalg.matrix_power(a, -1),
    lambda a: torch.linalg.cholesky(-a),
], ids=["inv", "inverse", "inv_batched", "solve", "matrix_power", "cholesky"])
def test_singular_linalg_raises_cpus_linalg_error(call, mode):
    """The *_ex kernel under each leaves Inf in its result and the failure in `info`; Debug
    flagged the Inf before linalg.inv could check `info` and raise CPU's LinAlgError."""
    from conftest import check_raises_like_cpu

    err = check_raises_like_cpu(lambda d: call(_SINGULAR.to(d)), mode)
    assert isinstance(err, torch.linalg.LinAlgError)


def test_debug_leaves_the_ex_kernels_failures_to_their_info():
    """inv_ex and solve_ex report a singular input in `info` and raise nothing, as on CPU."""
    check_all_modes(lambda d: [*torch.linalg.inv_ex(_SINGULAR.to(d)),
                               *torch.linalg.solve_ex(_SINGULAR.to(d), torch.ones(2, 1).to(d))])


def test_debug_lets_index_fills_negative_indices_through():
    """index_fill takes negative indices from the end, as advanced indexing does; Debug flagged
    them as out of range."""
    x = torch.arange(12.0).reshape(3, 4)
    check_all_modes(lambda d: x.to(d).index_fill(1, torch.tensor([0, -1]).to(d), -2.5))


def test_strict_and_deferred_pay_for_no_checks(monkeypatch):
    from deferfuse.executors import data_checks as dbg
    from deferfuse.executors import nonfinite

    calls = []
    monkeypatch.setattr(dbg, "_check_indices", lambda *a: calls.append(a))
    monkeypatch.setattr(nonfinite, "finite_inputs", lambda *a: calls.append(a) or {})
    x = torch.arange(12.0).reshape(4, 3).to("tpu")
    i = torch.tensor([1, 2]).to("tpu")
    for m in ("strict", "defer_and_fuse"):
        with deferfuse.mode(m):
            torch.log(torch.index_select(x, 0, i)).cpu()
    assert calls == []
    with deferfuse.mode("debug"):
        torch.log(torch.index_select(x, 0, i)).cpu()
    assert calls


def test_debug_blocks_after_each_op():
    with deferfuse.mode("debug"):
        y = torch.ones(3, device="tpu") * 2
        assert deferfuse.metrics()["pending_nodes"] == 0
        assert y._st.value is not None and y._st.value.is_ready()


@pytest.mark.subprocess
def test_debug_error_inside_backward_is_raised_by_backward():
    """A Debug check that fires inside backward raised through PyTorch's autograd engine, whose
    device-guard cleanup then aborted the process; it is raised by backward() instead. Run in a
    subprocess, so that a regression fails this test rather than killing the suite."""
    import subprocess
    import sys

    code = (
        "import os; os.environ['DEFERFUSE_DEBUG_NAN_CHECK'] = 'raise'\n"  # sqrt's gradient at 0 is inf on CPU too
        "import torch, deferfuse\n"
        "with deferfuse.mode('debug'):\n"
        "    x = torch.zeros(3, device='tpu', requires_grad=True)\n"
        "    try:\n"
        "        x.sqrt().sum().backward()\n"
        "    except RuntimeError as e:\n"
        "        print('raised', 'produced NaN or Inf' in str(e))\n"
        "    y = torch.ones(3, device='tpu', requires_grad=True)\n"
        "    (y * 2).sum().backward()\n"
        "    print('after', y.grad.cpu().tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.split("\n")[:2] == ["raised True", "after [2.0, 2.0, 2.0]"]


def test_debug_lets_radams_intended_division_by_zero_through(monkeypatch):
    """Stock (foreach) RAdam divides by a zero scalar on purpose in its first steps; Debug
    flagged it, so RAdam could not run in Debug mode. A plain division by zero still raises
    under the strictest setting."""
    monkeypatch.setattr(deferfuse.CONFIG, "debug_nan_check", "raise")
    def run(d):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.ones(3).to(d))
        opt = torch.optim.RAdam([p], lr=0.01)
        for _ in range(3):
            (p * torch.arange(3.0).to(d)).sum().backward()
            opt.step()
            opt.zero_grad()
        return p.detach()

    want = run("cpu")
    with deferfuse.mode("debug"):
        torch.testing.assert_close(run("tpu").cpu(), want)
        with pytest.raises(RuntimeError, match="produced NaN or Inf"):
            (torch.ones(3, device="tpu") / 0.0).cpu()
