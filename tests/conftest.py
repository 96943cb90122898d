"""Shared helpers: run the same code on CPU PyTorch and on "tpu" in each mode, and compare.

Also the hooks of the device profile (tests/device_profile.py, whose docstring has the whole
list and the reasons): `--device-profile` (`./dev test-device`) runs in this one process what a
session with one real accelerator runs: the in-process core tests (not those marked `subprocess`,
which start a second Python process that would contend for the chip, nor `xla_cpu`, which assert
XLA:CPU's own behaviour, nor tests/distributed, test_hf_trainer, the bench harness and the files
of host-side logic), a fixed third of each parametrized core test's cases, a fixed seventh of the
OpInfo ci profile's entries, the model zoo's DeferAndFuse forwards and Strict training steps, and
the fuzzer's ci seeds; then a summary by suite. Cut to about 12 minutes on our CPU machines, for
about 20 on a TPU, slower to compile (an estimate until it has run on one).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys

# The suite runs with the persistent compile cache off (tests of the cache give it a folder of
# their own), so that no test depends on what an earlier run left on disk. Set before
# `import torch`, whose autoload imports deferfuse and reads the environment.
os.environ.setdefault("DEFERFUSE_CACHE_DIR", "")
# On a GPU each xdist worker's JAX would take 75% of the device's memory at its first array, and
# the second worker's tests fail to allocate; allocating on demand lets the workers share it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import device_profile as _profile  # noqa: E402  (first: its wall time counts importing torch)
import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import deferfuse

# the device profile's hooks, bound here so pytest finds them in this conftest
pytest_addoption = _profile.pytest_addoption
pytest_configure = _profile.pytest_configure
pytest_collection_modifyitems = _profile.pytest_collection_modifyitems
pytest_report_header = _profile.pytest_report_header
pytest_runtest_protocol = _profile.pytest_runtest_protocol
pytest_runtest_makereport = _profile.pytest_runtest_makereport
pytest_sessionfinish = _profile.pytest_sessionfinish
pytest_unconfigure = _profile.pytest_unconfigure
pytest_terminal_summary = _profile.pytest_terminal_summary

MODES = ["strict", "debug", "defer_and_fuse"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))


def child_env(*paths: str, **env: str) -> dict[str, str]:
    """The environment of a test's child process: deferfuse (and `paths`) importable, and the host's
    own PYTHONPATH kept, for on a TPU host torch is there."""
    path = os.pathsep.join(p for p in (ROOT, *paths, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **env}


_SUMMARY = re.compile(r"^compile: (\d+) programs, ([\d.]+)s, ([\d.]+)s of it in XLA \(persistent cache: (\d+) hits, "
                      r"(\d+) misses\)$", re.M)


def read_summary(out: str) -> dict:
    """The numbers in an example's last lines (examples/loop.py `summary`), by metrics() name."""
    programs, seconds, xla, hits, misses = _SUMMARY.search(out).groups()
    flushes = re.search(r"^flushes: (\d+)(?: \((.*)\))?$", out, re.M)
    by_cause = {c: int(n) for n, c in (part.split(" ", 1) for part in (flushes[2] or "").split(", ") if part)}
    return {"programs_compiled": int(programs), "compile_seconds": float(seconds), "xla_compile_seconds": float(xla),
            "persistent_cache_hits": int(hits), "persistent_cache_misses": int(misses),
            "flushes": int(flushes[1]), "flushes_by_cause": by_cause,
            "cpu_fallbacks_total": int(re.search(r"^CPU fallbacks: (\d+)", out, re.M)[1])}


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu() if x.device.type == "tpu" else x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(y) for y in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


def run_on(fn, device: str, mode: str | None):
    ctx = deferfuse.mode(mode) if mode else contextlib.nullcontext()
    with ctx:
        out = fn(device)
        out = to_cpu(out)
    return out


def check_all_modes(fn, **tol):
    """fn(device) -> tensors; its result on tpu in every mode must equal CPU eager's."""
    expected = run_on(fn, "cpu", None)
    for m in MODES:
        got = run_on(fn, "tpu", m)
        torch.testing.assert_close(got, expected, **tol, msg=lambda s, m=m: f"[{m}] {s}")


def check_raises_like_cpu(fn, mode: str) -> BaseException:
    """fn(device) raises on CPU; on tpu in `mode` it must raise the same type with the same
    message, during the call (not at a later flush). Returns the tpu exception."""
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(type(cpu.value)) as got:
        with deferfuse.mode(mode):
            fn("tpu")
    assert str(got.value) == str(cpu.value)
    return got.value


def train_toy(device, layers, make_opt, loss_of, steps=4, clip=None):
    """The loop the optimizer tests share: `layers` (a Sequential over 6 inputs and 3 outputs,
    seeded) trained for `steps` on seeded batches of 5 with class targets; `loss_of(out, t)`.
    Returns the model and its optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*layers()).to(device)
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 6, generator=g).to(device)
        t = torch.randint(0, 3, (5,), generator=g).to(device)
        loss_of(model(x), t).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.fixture(autouse=True)
def _clean_engine():
    deferfuse.sync()
    deferfuse.reset_metrics()
    yield
    deferfuse.sync()


def on_tpu() -> bool:
    """Whether this process's device is a TPU (asked when a test runs, not at import: that would
    open the device before a test could configure JAX)."""
    return deferfuse.target.platform() == "tpu"


_NARROW = (torch.float32, torch.complex64)


@pytest.fixture(autouse=True)
def _tpu_tolerance(request, monkeypatch):
    """`@pytest.mark.tpu_tolerance(times=N, why=...)`: on a TPU, where XLA's float32 transcendental
    functions and bf16-pass matmuls are not XLA:CPU's (docs/testing.md), this test's
    `torch.testing.assert_close` of float32 and complex64 values allows N times the tolerance it
    would (its own, or PyTorch's default for the dtype). Other dtypes, and every other platform,
    compare as written."""
    mark = request.node.get_closest_marker("tpu_tolerance")
    if mark is None or not on_tpu():
        yield
        return
    assert mark.kwargs.get("why"), "a tpu_tolerance says why"
    monkeypatch.setattr(torch.testing, "assert_close", widened(torch.testing.assert_close, mark.kwargs["times"]))
    yield


def widened(original, times: float):
    """`original` (torch.testing.assert_close) allowing `times` the tolerance where every floating
    value compared is float32 or complex64; other comparisons are passed on as written."""
    def assert_close(actual, expected, *args, rtol=None, atol=None, **kwargs):
        floats = [t.dtype for t in tree_leaves(actual)
                  if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
        if floats and all(d in _NARROW for d in floats):
            rtol, atol = (1.3e-6 if rtol is None else rtol) * times, (1e-5 if atol is None else atol) * times
        return original(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)

    return assert_close


@pytest.fixture(autouse=True)
def _no_complex128_on_a_tpu(request):
    """A TPU cannot hold complex128 (deferfuse/device_dtypes.py): a case parametrized by it has
    nothing to run there; tests/test_device_limits.py checks that such tensors are refused."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if any(v is torch.complex128 for v in params.values()) and on_tpu():
        pytest.skip("complex128 cannot be held on a TPU (deferfuse/device_dtypes.py)")


@pytest.fixture
def fresh_dynamo():
    """Dynamo's compiled frames and counters are process-wide: each torch.compile test starts and
    ends without another's guards, graphs or recompile counts."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def events():
    deferfuse.events.start_collecting()
    try:
        yield deferfuse.events.events
    finally:
        deferfuse.events.stop_collecting()
