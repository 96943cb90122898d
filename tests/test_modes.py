"""Debug checks, RNG determinism across modes, dtype round-trips, the device and torch.tpu."""
from __future__ import annotations

import inspect
import os
import traceback
import warnings

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


# --- RNG ---------------------------------------------------------------------------------------------


def _random_program():
    a = torch.rand(4, device="tpu")
    b = torch.randn(2, 3, device="tpu")
    c = torch.randint(0, 100, (5,), device="tpu")
    d = torch.empty(6, device="tpu").normal_(2.0, 0.5)
    e = torch.empty(6, device="tpu").uniform_(-1, 1)
    f = torch.bernoulli(torch.full((8,), 0.5, device="tpu"))
    g = F.dropout(torch.ones(10, device="tpu"), 0.3)
    return [t.cpu() for t in (a, b, c, d, e, f, g)]


def test_rng_is_deterministic_and_identical_across_modes():
    results = []
    for m in MODES:
        torch.manual_seed(123)
        with deferfuse.mode(m):
            results.append(_random_program())
    for other in results[1:]:
        for x, y in zip(results[0], other):
            assert torch.equal(x, y)
    torch.tpu.manual_seed(123)
    again = _random_program()
    for x, y in zip(results[0], again):
        assert torch.equal(x, y)


def test_rng_gives_fresh_values_and_sane_statistics():
    torch.manual_seed(0)
    with deferfuse.mode():
        a = torch.rand(20000, device="tpu")
        b = torch.rand(20000, device="tpu")
        n = torch.randn(20000, device="tpu")
        a, b, n = a.cpu(), b.cpu(), n.cpu()
    assert not torch.equal(a, b)
    assert 0.0 <= a.min() and a.max() < 1.0 and abs(a.mean().item() - 0.5) < 0.02
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05


def test_dropout_in_a_loop_does_not_recompile():
    x = torch.ones(64, device="tpu")
    before = deferfuse.metrics()["cache_misses"]
    with deferfuse.mode():
        outs = []
        for _ in range(6):
            outs.append(F.dropout(x, 0.5).sum().item())
    assert len(set(outs)) > 1
    assert deferfuse.metrics()["cache_misses"] == before + 1


# --- dtypes -------------------------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_round_trip(dtype):
    if dtype == torch.bool:
        x = torch.tensor([True, False, True])
    elif dtype.is_complex:
        x = torch.tensor([1 + 2j, -3.5j, 7.25], dtype=dtype)
    elif dtype.is_floating_point:
        x = torch.tensor([1.5, -2.25, 3e5, 1e-3], dtype=dtype)
    else:
        info = torch.iinfo(dtype)
        x = torch.tensor([info.min, 0, 1, info.max], dtype=dtype)
    t = x.to("tpu")
    assert t.dtype == dtype and t.device.type == "tpu"
    back = t.cpu()
    assert back.dtype == dtype and torch.equal(back, x)
    assert t.tolist() == x.tolist()
    with deferfuse.mode():
        y = (t + t) if dtype != torch.bool else (t | t)
        torch.testing.assert_close(y.cpu(), (x + x) if dtype != torch.bool else (x | x))


def test_int64_and_float64_are_not_downcast():
    big = torch.tensor([2**40 + 1, -(2**50)], dtype=torch.int64)
    precise = torch.tensor([1 / 3], dtype=torch.float64)
    with deferfuse.mode():
        assert torch.equal((big.to("tpu") * 2).cpu(), big * 2)
        assert (precise.to("tpu") * 3).cpu().item() == (precise * 3).item()


# --- the device and torch.tpu ----------------------------------------------------------------------


def test_device_basics():
    d = torch.device("tpu")
    assert d.type == "tpu"
    t = torch.zeros(2, 3, device="tpu")
    assert t.device == torch.device("tpu", 0) and t.device.type == "tpu" and t.is_tpu
    for make in (
        lambda: torch.ones(2, device="tpu"),
        lambda: torch.full((2,), 7, device="tpu"),
        lambda: torch.arange(5, device="tpu"),
        lambda: torch.empty(3, device="tpu"),
        lambda: torch.rand(3, device="tpu"),
        lambda: torch.randn(3, device="tpu"),
        lambda: torch.randint(0, 5, (3,), device="tpu"),
        lambda: torch.tensor([1, 2], device="tpu"),
        lambda: torch.zeros_like(t),
        lambda: torch.ones_like(t, dtype=torch.int32),
        lambda: torch.full_like(t, 2.0),
        lambda: torch.empty_like(t),
        lambda: torch.rand_like(t),
    ):
        for ctx in (None, "defer_and_fuse"):
            with (deferfuse.mode(ctx) if ctx else torch.no_grad()):
                out = make()
                assert out.device.type == "tpu"
                out.cpu()
    m = torch.nn.Linear(3, 2).to("tpu")
    assert m.weight.device.type == "tpu" and isinstance(m.weight, torch.nn.Parameter)
    assert m(torch.ones(1, 3, device="tpu")).shape == (1, 2)


class _TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 8)
        self.head = torch.nn.Linear(8, 11, bias=False)
        self.head.weight = self.emb.weight


@pytest.mark.parametrize("mode", MODES)
def test_moving_a_module_keeps_tied_weights_tied(mode):
    """Tied weights stay tied through `.to("tpu")`, as with CUDA: untying them trained two
    weights where CPU trains one."""
    def train(d):
        torch.manual_seed(0)
        m = _TiedLM().to(d)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        assert m.head.weight is m.emb.weight and len(list(m.parameters())) == 1
        x = torch.tensor([[1, 2, 3, 2]]).to(d)
        for _ in range(3):
            F.cross_entropy(m.head(m.emb(x))[0], x[0]).backward()
            opt.step()
            opt.zero_grad()
        return m.emb.weight.detach()

    want = train("cpu")
    with deferfuse.mode(mode):
        got = train("tpu").cpu()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", MODES)
def test_a_tensor_built_from_tpu_scalars(mode):
    """torch.tensor / as_tensor over tpu 0-dim tensors read each one from C++ below the Python
    key (`_local_scalar_dense` at PrivateUse1), as for CUDA tensors."""
    with deferfuse.mode(mode):
        a = torch.tensor(1.5).to("tpu") * 2
        b = torch.tensor([2.5]).to("tpu")
        got = [torch.tensor([a, b]), torch.as_tensor([a, a]), a.new_tensor([b, a]), torch.tensor([[a], [b]])]
        got = [t.cpu() for t in got]
    torch.testing.assert_close(got, [torch.tensor([3.0, 2.5]), torch.tensor([3.0, 3.0]),
                                     torch.tensor([2.5, 3.0]), torch.tensor([[3.0], [2.5]])])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputes_dropout_with_the_same_mask(mode, reentrant):
    """torch.utils.checkpoint saves and restores the tpu RNG state around the recompute (it
    skipped it, so backward drew a new mask: silently wrong gradients)."""
    from torch.utils.checkpoint import checkpoint

    with deferfuse.mode(mode):
        w = torch.ones(64, device="tpu", requires_grad=True)
        torch.manual_seed(0)
        out = checkpoint(lambda a: F.dropout(a, 0.5, training=True), w, use_reentrant=reentrant)
        out.sum().backward()
        torch.testing.assert_close(w.grad.cpu(), out.detach().cpu())


def test_fork_rng_on_tpu():
    torch.manual_seed(1)
    with torch.random.fork_rng(device_type="tpu"):
        torch.manual_seed(3)
        torch.rand(2, device="tpu")
    after = torch.rand(4, device="tpu").cpu()
    torch.manual_seed(1)
    assert torch.equal(torch.rand(4, device="tpu").cpu(), after)
    with torch.tpu.device(0), torch.tpu.device(torch.device("tpu:0")):
        pass
    with pytest.raises(RuntimeError, match="one tpu device"):
        torch.tpu.device(1)


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


def test_one_hot_without_fallbacks():
    def run(d):
        i = torch.tensor([[1, 0], [2, 2]]).to(d)
        return [F.one_hot(i), F.one_hot(i, 5), F.one_hot(torch.tensor([], dtype=torch.long).to(d), 3)]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU fallback warns
        check_all_modes(run)


def test_dataloader_with_pin_memory():
    """pin_memory=True, standard in CUDA scripts, passes batches through unpinned (it raised:
    PyTorch has no pinned allocator for a Python backend)."""
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.arange(16.0).reshape(8, 2), torch.arange(8))
    got = [(x.to("tpu") * 2).cpu() for x, _ in DataLoader(ds, batch_size=4, pin_memory=True)]
    torch.testing.assert_close(torch.cat(got), torch.arange(16.0).reshape(8, 2) * 2)


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(0, dtype=torch.int64), lambda: torch.zeros(0, dtype=torch.bool), lambda: torch.zeros(2, 0),
    lambda: torch.zeros(0, dtype=torch.float16), lambda: torch.tensor([1, 2]), lambda: torch.tensor([1j]),
    lambda: torch.tensor([1.0], dtype=torch.float64),
])
def test_repr_shows_dtype_as_cpu_does(make):
    """An empty tensor shows any dtype but the default one (tpu left out int64 and bool)."""
    t = make()
    shown = repr(t.to("tpu"))
    assert "device='tpu:0'" in shown and shown.replace(", device='tpu:0'", "") == repr(t)


def test_host_reads():
    t = torch.tensor([[1.5, 2.0]]).to("tpu")
    assert t.tolist() == [[1.5, 2.0]]
    assert t.cpu().numpy().tolist() == [[1.5, 2.0]]
    assert float(t[0, 0]) == 1.5 and int(t[0, 1]) == 2 and bool(t[0, 0])
    assert t[0, 1].item() == 2.0
    assert "device='tpu:0'" in repr(t) and "tensor([[1.5000, 2.0000]]" in str(t)
    with pytest.raises(TypeError):
        t.numpy()


def test_torch_tpu_module():
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1 and torch.tpu.current_device() == 0
    torch.tpu.manual_seed(5)
    a = torch.rand(3, device="tpu").cpu()
    torch.tpu.manual_seed(5)
    b = torch.rand(3, device="tpu").cpu()
    assert torch.equal(a, b)
    state = torch.tpu.get_rng_state()
    c = torch.rand(3, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="tpu").cpu(), c)
    torch.tpu.synchronize()


# torch.cuda's own errors for a device it lacks: selecting it fails ("invalid device ordinal"),
# the RNG state functions index a tuple of generators, the name is read through an assert
_BY_DEVICE = {
    "synchronize": (lambda d: torch.tpu.synchronize(d), torch.AcceleratorError),
    "device": (lambda d: torch.tpu.device(d).__enter__(), torch.AcceleratorError),
    "set_device": (lambda d: torch.tpu.set_device(d), torch.AcceleratorError),
    "get_rng_state": (lambda d: torch.tpu.get_rng_state(d), IndexError),
    "set_rng_state": (lambda d: torch.tpu.set_rng_state(torch.tpu.get_rng_state(), device=d), IndexError),
    "get_device_name": (lambda d: torch.tpu.get_device_name(d), AssertionError),
}


@pytest.mark.parametrize("fn", sorted(_BY_DEVICE))
def test_torch_tpu_refuses_a_device_it_lacks_as_torch_cuda_does(fn):
    """Any index was taken for the one device: synchronize(1) synchronized tpu:0."""
    call, error = _BY_DEVICE[fn]
    for ok in (None, 0, "tpu", "tpu:0", torch.device("tpu"), torch.device("tpu", 0)):
        call(ok)
    for bad in (1, 5, "tpu:1", torch.device("tpu", 1)):
        with pytest.raises(error):
            call(bad)
    for other in ("cuda:0", "cpu", torch.device("cpu")):
        with pytest.raises(ValueError, match="Expected a tpu device"):
            call(other)


@pytest.mark.parametrize("mode", MODES)
def test_backward_runs_on_the_calling_thread(mode):
    """Autograd would hand a non-CPU device's backward to a worker thread; deferfuse keeps it on
    the caller's (the handoff costs a millisecond per call and buys nothing), in a mode block on
    any thread, and restores the thread's setting when the block ends."""
    import threading

    def run(results):
        w = torch.randn(4, 3, device="tpu", requires_grad=True)
        seen = []
        w.register_hook(lambda g: seen.append(threading.current_thread()))
        before = torch._C._is_multithreading_enabled()
        with deferfuse.mode(mode):
            (w * 2).sum().backward()
            inside = torch._C._is_multithreading_enabled()
        results.append((seen, threading.current_thread(), before, inside, torch._C._is_multithreading_enabled()))
        torch.testing.assert_close(w.grad.cpu(), torch.full((4, 3), 2.0))

    results: list = []
    worker = threading.Thread(target=run, args=(results,))  # a thread that never imported deferfuse
    worker.start()
    worker.join()
    (seen, caller, before, inside, after), = results
    assert seen == [caller]
    assert before and not inside and after
    run(results)  # the importing thread runs backward here outside blocks too
    seen, caller, before, _, after = results[1]
    assert seen == [caller] and not before and not after


@pytest.mark.parametrize("mode", MODES)
def test_cpu_ops_inside_a_block_run_untouched(mode):
    """A block selects the executor for tpu ops; CPU ops in it must behave exactly as outside.
    PyTorch's matrix_rank(out=) leaves `out` unwritten whenever any dispatch mode is active, so
    this fails if the block ever installs one."""
    a = torch.randn(5, 5, dtype=torch.float64)
    out = torch.full((), -1, dtype=torch.int64)
    before = deferfuse.metrics()["ops_recorded"]
    with deferfuse.mode(mode):
        torch.linalg.matrix_rank(a, out=out)
        s = (a * 2).sum().item()
    assert out.item() == torch.linalg.matrix_rank(a).item()
    assert s == (a * 2).sum().item()
    assert deferfuse.metrics()["ops_recorded"] == before


@pytest.mark.parametrize("make", [
    lambda d: torch.arange(64, device=d),
    lambda d: torch.arange(1.0, 3.0, 0.5, device=d),
    lambda d: torch.full((3, 2), 1.5, device=d),
    lambda d: torch.zeros(4, dtype=torch.int32, device=d),
    lambda d: torch.eye(3, 4, device=d),
])
def test_factories_with_a_lowering_dispatch_once(make):
    """PyTorch's CompositeExplicit factory kernels would reach deferfuse as empty + the out=
    variant (+ a resize for arange); deferfuse registers its own PrivateUse1 kernels for the
    factories it lowers, so each call is one dispatch and one node, with CPU's values."""
    from deferfuse import dispatch as D, install
    from deferfuse.tensor import TpuTensor

    seen = []
    orig, orig_entry = install.dispatch, TpuTensor.__dict__["__torch_dispatch__"]

    def spy(func, args, kwargs):  # the factory kernels' way in
        seen.append(func)
        return orig(func, args, kwargs)

    def spy_entry(cls, func, types, args=(), kwargs=None):  # every op on a tpu tensor
        seen.append(func)
        return D.torch_dispatch(cls, func, types, args, kwargs)

    with deferfuse.mode():
        make("tpu")  # the first call learns the op
        install.dispatch, TpuTensor.__torch_dispatch__ = spy, classmethod(spy_entry)
        try:
            out = make("tpu")
        finally:
            install.dispatch, TpuTensor.__torch_dispatch__ = orig, orig_entry
    assert len(seen) == 1, seen
    want = make("cpu")
    assert out.dtype == want.dtype
    torch.testing.assert_close(out.cpu(), want)


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
