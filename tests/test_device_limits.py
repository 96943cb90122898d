"""What a TPU lacks (deferfuse/lowering/device_limits.py, deferfuse/device_dtypes.py): float64 FFTs
and LU-family factorizations, int64 matrix products and calls with a Python complex number take the
CPU fallback on a TPU, named with the dtype and the device, or raise so under
DEFERFUSE_NO_CPU_FALLBACK; a complex128 tensor cannot be held there at all, so what would make one
raises naming the op; the first float64 tensor warns once. Every other dtype, and every dtype on
this machine's own platform, stays lowered. Here the TPU is the table's: `target.platform()` is
patched, so these run on any backend; the TPU profile of the suite runs the same calls on the chip.
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
import torch

import deferfuse
from conftest import MODES, run_on
from deferfuse.config import CONFIG
from deferfuse import device_dtypes, target
from deferfuse.lowering import device_limits
from deferfuse.lowering.elementwise import copysign, signbit
from deferfuse.record import forget_recipes
from deferfuse.routes import fallback

_G = torch.Generator().manual_seed(0)


def _rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, generator=_G)


@pytest.fixture
def on_tpu(monkeypatch):
    """The TPU's table, with no recipe or refusal left from another platform's calls."""
    monkeypatch.setattr(target, "platform", lambda: "tpu")
    monkeypatch.setattr(device_dtypes, "_warned", {("tpu", torch.float64)})  # the float64 note said
    forget_recipes()
    device_limits.forget()
    yield
    forget_recipes()
    device_limits.forget()


def _well_conditioned(dtype):
    return _rand(3, 4, 4, dtype=dtype) + 4 * torch.eye(4, dtype=dtype)


CASES = {
    "inv": (lambda a: torch.linalg.inv(a), "aten.linalg_inv_ex.default"),
    "solve": (lambda a: torch.linalg.solve(a, a[..., :2]), "aten._linalg_solve_ex.default"),
    "slogdet": (lambda a: list(torch.linalg.slogdet(a)), "aten._linalg_slogdet.default"),
    "cholesky": (lambda a: torch.linalg.cholesky(a @ a.mT.conj()), "aten.linalg_cholesky_ex.default"),
    "fft": (lambda a: torch.fft.fft2(a), None),
    "rfft": (lambda a: torch.fft.irfft(torch.fft.rfft(a.real)), None),
}


_LU = sorted(c for c in CASES if CASES[c][1] is not None)


@pytest.mark.parametrize("case", _LU)
def test_a_float64_factorization_the_tpu_lacks_runs_on_cpu_named(on_tpu, case):
    fn, op = CASES[case]
    a = _well_conditioned(torch.float64)
    expected = fn(a)
    for mode in MODES:
        deferfuse.reset_metrics()
        got = run_on(lambda d: fn(a.to(d)), "tpu", mode)
        torch.testing.assert_close(got, expected, msg=lambda s, m=mode: f"[{m}] {s}")
        assert op in deferfuse.metrics()["cpu_fallbacks"], (mode, deferfuse.metrics()["cpu_fallbacks"])


MAKES_COMPLEX128 = {  # (fn of a float64 tensor on the device, the op named)
    "fft2": (torch.fft.fft2, r"aten\._to_copy\.default"),  # fft2 casts its real input to complex first
    "rfft": (torch.fft.rfft, r"aten\._fft_r2c\.default"),
    "complex": (lambda a: torch.complex(a, a), r"aten\.complex\.default"),
    "cast": (lambda a: a.to(torch.complex128), r"aten\._to_copy\.default"),
    "factory": (lambda a: torch.zeros(3, dtype=torch.complex128, device=a.device), r"aten\.zeros\.default"),
    "empty": (lambda a: torch.empty(3, dtype=torch.complex128, device=a.device), r"aten\.empty\.memory_format"),
    "randn": (lambda a: torch.randn(3, dtype=torch.complex128, device=a.device), r"aten\.empty\.memory_format"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(MAKES_COMPLEX128))
def test_a_complex128_result_on_a_tpu_raises_naming_op_dtype_and_device(on_tpu, case, mode):
    """XLA:TPU does not keep complex128 intact: what would make one on the device raises at the
    user's line, naming the op, and leaves the input as it was."""
    fn, op = MAKES_COMPLEX128[case]
    a = _well_conditioned(torch.float64)
    with deferfuse.mode(mode):
        x = a.to("tpu")
        with pytest.raises(NotImplementedError, match=op + r".*complex128 tensors cannot be held on a tpu device"):
            fn(x)
        torch.testing.assert_close(x.cpu(), a)


def test_a_complex128_tensor_cannot_be_moved_to_a_tpu(on_tpu):
    a = _rand(4, dtype=torch.complex128)
    for move in (lambda: a.to("tpu"), lambda: torch.tensor([1j], dtype=torch.complex128, device="tpu"),
                 lambda: torch.empty(1, dtype=torch.complex64, device="tpu").copy_(a[:1]).to(torch.complex128)):
        with pytest.raises(NotImplementedError, match=r"complex128 tensors cannot be held on a tpu device \(tpu\)"):
            move()


def test_the_first_float64_tensor_on_a_tpu_warns_once_what_the_emulation_keeps(on_tpu, monkeypatch):
    monkeypatch.setattr(device_dtypes, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.ones(3, dtype=torch.float64).to("tpu")
        (x * 2).to(torch.float64).cpu()
        torch.ones(2, dtype=torch.float64).to("tpu")
    said = [str(w.message) for w in caught if "float64 on a tpu device (tpu) is emulated" in str(w.message)]
    assert len(said) == 1 and "float32's exponent range" in said[0], said
    assert caught[0].filename == __file__  # at the user's line


_INT = torch.Generator().manual_seed(1)
OTHERS = {  # (fn, inputs, the ops that must fall back): what the chip refused outside fft and LU
    "int64 mm": (lambda a, b: a @ b, lambda: (torch.randint(-9, 9, (3, 4), generator=_INT),
                                               torch.randint(-9, 9, (4, 2), generator=_INT)), {"aten.mm.default"}),
    "int64 bmm": (lambda a, b: a @ b, lambda: (torch.randint(-9, 9, (2, 3, 4), generator=_INT),
                                                torch.randint(-9, 9, (2, 4, 2), generator=_INT)), {"aten.bmm.default"}),
    "int64 addmm": (lambda a, b: torch.addmm(a[:, :2], a, b, alpha=2),
                    lambda: (torch.randint(-9, 9, (3, 4), generator=_INT), torch.randint(-9, 9, (4, 2), generator=_INT)),
                    {"aten.addmm.default"}),
    # a Python complex number is a complex128 operand to XLA: the call runs on CPU (it aborted compiling)
    "complex bound": (lambda x: x.clamp(min=2 + 0j), lambda: (torch.tensor([1.0, 3.0, -2.0], dtype=torch.bfloat16),),
                      {"aten.clamp.default"}),
    "complex scalar": (lambda x: x * (1 + 2j), lambda: (_rand(4, dtype=torch.complex64),), {"aten.mul.Tensor"}),
}


@pytest.mark.parametrize("case", sorted(OTHERS))
def test_int64_products_and_complex_scalars_run_on_cpu_named(on_tpu, case):
    fn, inputs, ops = OTHERS[case]
    xs = inputs()
    expected = fn(*xs)
    for mode in MODES:
        deferfuse.reset_metrics()
        got = run_on(lambda d: fn(*(x.to(d) for x in xs)), "tpu", mode)
        torch.testing.assert_close(got, expected, msg=lambda s, m=mode: f"[{m}] {s}")
        assert ops <= set(deferfuse.metrics()["cpu_fallbacks"]), (mode, deferfuse.metrics()["cpu_fallbacks"])


def test_int32_products_stay_lowered(on_tpu):
    a, b = (torch.randint(-9, 9, s, dtype=torch.int32, generator=_INT) for s in ((3, 4), (4, 2)))
    deferfuse.reset_metrics()
    torch.testing.assert_close(run_on(lambda d: a.to(d) @ b.to(d), "tpu", "defer_and_fuse"), a @ b)
    assert not deferfuse.metrics()["cpu_fallbacks"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_what_the_tpu_has_stays_lowered(on_tpu, case, dtype):
    fn, _ = CASES[case]
    a = _well_conditioned(dtype)
    deferfuse.reset_metrics()
    got = run_on(lambda d: fn(a.to(d)), "tpu", "defer_and_fuse")
    torch.testing.assert_close(got, fn(a), rtol=1e-4, atol=1e-4)
    assert not deferfuse.metrics()["cpu_fallbacks"]


def test_the_warning_names_the_op_the_dtype_and_the_device(on_tpu):
    fallback._warned.discard("aten.linalg_inv_ex.default")
    a = _well_conditioned(torch.float64).to("tpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.linalg.inv(a)
    text = [str(w.message) for w in caught if "Falling back" in str(w.message)]
    assert len(text) == 1, text
    assert "aten.linalg_inv_ex.default" in text[0] and "float64 on a tpu device" in text[0], text[0]


def test_without_the_fallback_it_raises_naming_op_dtype_and_device(on_tpu, monkeypatch):
    monkeypatch.setattr(CONFIG, "no_cpu_fallback", True)
    a = _well_conditioned(torch.float64).to("tpu")
    with pytest.raises(NotImplementedError, match=r"aten\._fft_r2c\.default.*float64 on a tpu device"):
        torch.fft.rfft(a)
    with pytest.raises(NotImplementedError, match=r"aten\._to_copy\.default.*complex128 tensors cannot be held on a tpu"):
        a.to(torch.complex128)
    with pytest.raises(NotImplementedError, match=r"aten\.linalg_inv_ex\.default.*float64 on a tpu device"):
        torch.linalg.inv(a)
    assert torch.equal(a.cpu(), a.cpu())  # the input is intact


def test_gradients_through_a_refused_op_match_cpu(on_tpu):
    a = _well_conditioned(torch.float64)

    def grad(d):
        x = a.to(d).requires_grad_()
        torch.linalg.inv(x).sum().backward()
        return x.grad

    torch.testing.assert_close(run_on(grad, "tpu", "defer_and_fuse"), grad("cpu"))


def test_this_platform_lowers_every_dtype():
    """Off a TPU (CPU here, or a GPU) nothing is refused: float64 stays lowered."""
    if device_limits.LIMITS.get(device_limits.platform()):
        pytest.skip("this machine's platform has limits of its own: the tests above apply to it directly")
    a = _well_conditioned(torch.float64)
    deferfuse.reset_metrics()
    got = run_on(lambda d: [torch.linalg.inv(a.to(d)), torch.fft.fft(a.to(d))], "tpu", "defer_and_fuse")
    torch.testing.assert_close(got, [torch.linalg.inv(a), torch.fft.fft(a)])
    assert not deferfuse.metrics()["cpu_fallbacks"]


_SIGNS = torch.tensor([0.0, -0.0, 1e-300, -1e-300, 1e30, -1e30, float("inf"), -float("inf"), 2.5, -2.5],
                      dtype=torch.float64)


@pytest.mark.parametrize("case", ["signbit", "copysign", "floor_divide", "abs"])
def test_float64_sign_ops_stay_lowered_and_exact(on_tpu, case):
    """XLA:TPU failed to compile jnp.signbit on float64 (a 64-bit shift of its bit pattern), and
    copysign and float floor division are built on it: these are lowered through float32's sign
    instead, which keeps the sign of zeros, infinities and numbers below float32's range. And its
    float64 abs left -0.0 negative (copysign on a TPU v5e, 2026-12-06): abs goes through it too."""
    fn = {"signbit": torch.signbit, "copysign": lambda x: torch.copysign(x.flip(0), x),
          "floor_divide": lambda x: torch.floor_divide(x.flip(0), x), "abs": torch.abs}[case]
    signs = _SIGNS.clone()
    if case == "floor_divide":  # on a real TPU 1e-300 is float32's zero (device_dtypes.py): x // 0 is not x // 1e-300
        signs[2:4] = torch.tensor([1e-30, -1e-30], dtype=torch.float64)
    for mode in MODES:
        deferfuse.reset_metrics()
        got = run_on(lambda d: fn(signs.to(d)), "tpu", mode)
        torch.testing.assert_close(got, fn(signs), equal_nan=True, msg=lambda s, m=mode: f"[{m}] {s}")
        if got.dtype.is_floating_point:  # the zeros' signs too (a NaN's sign is no result of either)
            want = fn(signs)
            assert torch.equal(torch.signbit(got)[~want.isnan()], torch.signbit(want)[~want.isnan()]), mode
        assert not deferfuse.metrics()["cpu_fallbacks"], mode


def test_float64_signbit_has_no_64_bit_shift():
    """What XLA:TPU refused, checked off the chip: the program holds no shift of a 64-bit integer."""
    x = jnp.ones(4, jnp.float64)
    for fn in (signbit, lambda a: copysign(a, -a)):
        text = jax.jit(fn).lower(x).as_text()
        assert not [line for line in text.splitlines() if "shift_right" in line and "i64" in line], text
