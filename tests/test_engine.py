"""Dead intermediates, errors at the recording line, failed flushes, the CPU fallback, the cache."""
from __future__ import annotations

import gc
import inspect
import traceback

import warnings

import numpy as np
import pytest
import torch

import deferfuse
from conftest import check_all_modes, on_tpu
from deferfuse import cache, pending
from deferfuse.graph import Graph, Op
from deferfuse.routes import fallback


def test_dead_intermediates_are_never_materialised(events):
    with deferfuse.mode():
        x = torch.arange(8.0, device="tpu")
        y = x * 2
        y = y + 1
        y = torch.exp(y)
        y = y.sum()
        del x
        value = y.item()
    flush = [e for e in events() if e["kind"] == "flush"][-1]
    assert flush["outputs"] == 1, flush
    assert flush["skipped"] >= 3
    # XLA:TPU's float32 exp near exp(15) is its own approximation: 2.7e-6 relative measured there
    assert value == pytest.approx(torch.exp(torch.arange(8.0) * 2 + 1).sum().item(), rel=4e-6 if on_tpu() else 1e-6)


def test_live_intermediate_becomes_an_output(events):
    with deferfuse.mode():
        x = torch.arange(8.0, device="tpu")
        y = x * 2
        z = (y + 1).sum()
        z.item()
    flush = [e for e in events() if e["kind"] == "flush"][-1]
    assert flush["outputs"] == 3  # x, y and z are alive
    torch.testing.assert_close(y.cpu(), torch.arange(8.0) * 2)


def test_shape_error_raises_at_the_recording_line_and_pending_work_survives():
    with deferfuse.mode():
        a = torch.ones(3, 4, device="tpu")
        b = a * 2 + 1  # pending
        line = inspect.currentframe().f_lineno + 2
        with pytest.raises(RuntimeError) as info:
            a + torch.ones(5, device="tpu")
        frames = traceback.extract_tb(info.value.__traceback__)
        assert any(f.filename == __file__ and f.lineno == line for f in frames)
        torch.testing.assert_close(b.cpu(), torch.full((3, 4), 3.0))


def test_each_node_remembers_the_users_line():
    """The line is read straight off the caller's frame when user code calls the op, and found
    by walking out of torch's own Python (F.gelu, a module's forward) otherwise."""
    from deferfuse import sources

    layer = torch.nn.Linear(4, 4).to("tpu")
    with deferfuse.mode():
        x = torch.ones(2, 4, device="tpu")
        first = inspect.currentframe().f_lineno + 1
        y = x * 3
        z = torch.nn.functional.gelu(y)
        w = layer(z)
        nodes = list(pending.PENDING.graph.nodes)
        lines = [sources.parts(n.where)[:2] for n in nodes[-3:]]
        w.cpu()
    assert lines[0] == (__file__, first)
    assert lines[1] == (__file__, first + 1)
    assert lines[2] == (__file__, first + 2)


def test_same_exception_types_as_cpu():
    for dev in ("cpu", "tpu"):
        with deferfuse.mode():
            x = torch.ones(2, 3, device=dev)
            with pytest.raises(IndexError):
                x[5]
            with pytest.raises(RuntimeError):
                x.view(4)
            with pytest.raises(RuntimeError):
                torch.mm(x, x)
            with pytest.raises(RuntimeError):
                x.add_(torch.ones(4, 2, 3, device=dev))


def test_failed_flush_raises_at_sync_point_and_keeps_engine_usable(monkeypatch):
    from deferfuse.lowering import LOWERINGS

    low = LOWERINGS[torch.ops.aten.sin.default]

    def broken(x):
        raise ValueError("lowering exploded")

    monkeypatch.setattr(low, "fn", broken) if False else None
    object.__setattr__(low, "fn", broken)
    try:
        with pytest.raises(deferfuse.FlushError) as info:
            with deferfuse.mode():
                a = torch.arange(4.0, device="tpu") + 1  # fine
                b = torch.sin(a) * 2  # this program cannot be built
                line = inspect.currentframe().f_lineno - 1
                a_host = a.cpu()  # noqa: F841
        msg = str(info.value)
        assert "aten.sin.default" in msg and f"{__file__}:{line}" in msg
        torch.testing.assert_close(a.cpu(), torch.arange(4.0) + 1)  # values before the failure are valid
        with pytest.raises(deferfuse.FlushError):
            b.cpu()  # values after it re-raise the failure
    finally:
        object.__setattr__(low, "fn", lambda x: __import__("jax").numpy.sin(x))
    with deferfuse.mode():
        c = torch.arange(3.0, device="tpu") * 3
        assert c.cpu().tolist() == [0.0, 3.0, 6.0]


_BOOM = torch.library.Library("deferfuse_test", "DEF")
_BOOM.define("boom(Tensor x) -> Tensor")
_BOOM.impl("boom", lambda x: (_ for _ in ()).throw(ValueError("the CPU kernel exploded")) if (x < 0).any() else x + 1,
           "CPU")  # its error depends on the values, as a data check's does
_BOOM.impl("boom", lambda x: torch.empty_like(x), "Meta")
_BOOM.define("pair(Tensor a, Tensor b) -> Tensor")
_BOOM.impl("pair", lambda a, b: a * 2 + b, "CPU")
_BOOM.impl("pair", lambda a, b: torch.empty_like(a), "Meta")
_BOOM.define("crooked(Tensor x) -> Tensor")
_BOOM.impl("crooked", lambda x: x.flip(0) * 2, "CPU")
_BOOM.impl("crooked", lambda x: x.no_such_attribute, "Meta")  # a meta kernel with a bug


def test_cpu_fallback_taking_one_tensor_twice():
    """A recorded CPU-fallback op given the same tensor in two arguments gets it in both."""
    x = torch.arange(4.0)
    with pytest.warns(UserWarning, match="deferfuse_test.pair"):
        with deferfuse.mode():
            t = x.to("tpu") + 1
            got = (torch.ops.deferfuse_test.pair(t, t) + torch.ops.deferfuse_test.pair(t, t * 3)).cpu()
    torch.testing.assert_close(got, (x + 1) * 3 + (x + 1) * 5)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_cpu_fallback_whose_meta_kernel_crashes_runs_at_once(mode):
    """A fallback op's meta kernel that crashes (any exception, not only NotImplementedError)
    cannot give the shapes a recorded host node needs: the op runs at once on CPU instead."""
    x = torch.arange(5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warns once per process
        with deferfuse.mode(mode):
            got = (torch.ops.deferfuse_test.crooked(x.to("tpu") + 1) - 1).cpu()
    torch.testing.assert_close(got, (x + 1).flip(0) * 2 - 1)
    assert deferfuse.metrics()["cpu_fallbacks"] == {"deferfuse_test.crooked.default": 1}


def test_failed_cpu_fallback_names_its_own_error():
    """A recorded CPU-fallback op whose CPU kernel raises: the flush error names the op and its
    error, and values recorded before it stay valid (they were run op by op without tracing the
    host op). The first call of the signature ran at once and was fine; this one is recorded."""
    with pytest.warns(UserWarning, match="deferfuse_test.boom"):
        with deferfuse.mode():
            assert torch.ops.deferfuse_test.boom(torch.arange(4.0, device="tpu")).cpu().tolist() == [1, 2, 3, 4]
        with pytest.raises(deferfuse.FlushError, match="deferfuse_test.boom.*ValueError: the CPU kernel exploded"):
            with deferfuse.mode():
                a = torch.arange(4.0, device="tpu") + 1
                b = torch.ops.deferfuse_test.boom(-a)
                b.cpu()
    torch.testing.assert_close(a.cpu(), torch.arange(4.0) + 1)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_a_cpu_fallback_refused_by_its_kernel_raises_its_error_at_the_call(mode):
    """The first call of a fallback signature runs at once on the real inputs, so a kernel that
    refuses what the meta kernel let through (a dtype: cummax of complex, median of bool, fuzzer
    seeds 20186, 20187)
    raises CPU's own exception at the user's line, not a FlushError at a later read."""
    with deferfuse.mode(mode):
        a = torch.arange(7.0, device="tpu") + 1  # a signature no other test calls boom with
        with pytest.raises(NotImplementedError, match="median_cpu"):  # cummax: its warning is tested once
            torch.ones(3, dtype=torch.bool, device="tpu").median()
        with pytest.raises(ValueError, match="exploded"):
            torch.ops.deferfuse_test.boom(-a)
        torch.testing.assert_close(a.cpu(), torch.arange(7.0) + 1)


def test_cpu_fallback_is_counted_and_warns_once(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())  # whatever ran cummax before in this process
    x = torch.arange(6.0).reshape(2, 3)
    with pytest.warns(UserWarning, match="Falling back to CPU for 'aten.cummax.default'"):
        vals, idx = torch.cummax(x.to("tpu"), dim=1)
    torch.testing.assert_close(vals.cpu(), torch.cummax(x, 1).values)
    assert deferfuse.metrics()["cpu_fallbacks"]["aten.cummax.default"] == 1
    torch.cummax(x.to("tpu"), dim=1)
    assert deferfuse.metrics()["cpu_fallbacks"]["aten.cummax.default"] == 2


def test_cpu_fallback_can_be_an_error(monkeypatch):
    monkeypatch.setattr(deferfuse.CONFIG, "no_cpu_fallback", True)
    with pytest.raises(NotImplementedError, match="aten.cummax.default"):
        torch.cummax(torch.ones(3, device="tpu"), dim=0)


def test_recorded_fallback_splits_programs(events):
    expected = float((torch.cummax((torch.arange(6.0).reshape(2, 3) + 1) * 2, 1).values + 1).sum())
    # a signature's first fallback runs at once (its CPU kernel's own errors then surface at the
    # user's line: routes/fallback.py); from its second call on it is recorded as a host node
    for _ in range(2):
        with deferfuse.mode():
            x = torch.arange(6.0, device="tpu").reshape(2, 3) + 1
            v, _ = torch.cummax(x * 2, dim=1)  # a host node in the middle of the graph
            out = (v + 1).sum().item()
        assert out == pytest.approx(expected)
    flush = [e for e in events() if e["kind"] == "flush"][-1]
    assert flush["groups"] >= 3  # device group, host op, device group


def test_strict_and_deferred_share_one_cache():
    x = torch.arange(5.0, device="tpu")
    with deferfuse.mode("strict"):
        torch.tanh(x)
    misses = deferfuse.metrics()["cache_misses"]
    with deferfuse.mode():
        y = torch.tanh(x)
        y.cpu()
    m = deferfuse.metrics()
    assert m["cache_misses"] == misses  # the one-op DeferAndFuse flush hit Strict's entry
    assert m["cache_hits"] >= 1


def test_scalars_do_not_recompile():
    x = torch.arange(5.0, device="tpu")
    before = deferfuse.metrics()["cache_misses"]
    with deferfuse.mode():
        for lr in (0.1, 0.2, 0.3, 0.4):
            (x * lr + lr).sum().item()
    assert deferfuse.metrics()["cache_misses"] == before + 1


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_runtime_scalars_reach_a_program_packed(mode, monkeypatch):
    """From two numbers on, a program takes its Python floats as one float64 array and its ints as
    one int64 array, unpacked in the trace as the weakly typed scalars JAX makes of Python numbers:
    float32 stays float32, an int past 2**53 stays exact, a 0-dim CPU tensor keeps its own dtype,
    and new values do not recompile."""
    passed = []
    real = cache.Compiled._scalars
    monkeypatch.setattr(cache.Compiled, "_scalars", lambda self, s: passed.append(real(self, s)) or passed[-1])
    big = 2**53 + 1

    def step(x, i, a, b, n):
        c = torch.tensor(1.5, dtype=torch.float64)  # a CPU scalar tensor: a runtime scalar of its own
        return torch.addcmul(x, x, x, value=a).clamp(b, 3.5) * c, i * n + big

    x, i = torch.arange(5.0), torch.arange(5)
    xt, it = x.to("tpu"), i.to("tpu")
    misses = []
    for a, b, n in ((0.3, 0.5, 3), (0.7, 0.25, 5)):
        with deferfuse.mode(mode):
            got = [t.cpu() for t in step(xt, it, a, b, n)]
        misses.append(deferfuse.metrics()["cache_misses"])
        want = step(x, i, a, b, n)
        assert [g.dtype for g in got] == [torch.float32, torch.int64]
        torch.testing.assert_close(got[0], want[0])
        assert torch.equal(got[1], want[1])
    assert misses[1] == misses[0]
    packed = [p for p in passed if isinstance(p, tuple)]
    assert packed and all(f is None or f.dtype == np.float64 for f, _, _ in packed)
    if mode == "strict":  # op by op: clamp's two bounds are the one call with two numbers
        assert [list(f) for f, _, _ in packed[-1:]] == [[0.25, 3.5]]
    else:  # one flush: every float, int and the CPU scalar in one call
        f, n, rest = packed[-1]
        assert list(f) == [0.7, 0.25, 3.5] and list(n) == [5, big] and n.dtype == np.int64
        assert len(rest) == 1 and rest[0].dtype == np.float64


def test_metrics_and_reset():
    with deferfuse.mode():
        (torch.ones(3, device="tpu") * 2).sum().item()
    m = deferfuse.metrics()
    for key in ("ops_recorded", "flushes_by_cause", "cache_hits", "cache_misses", "compile_seconds",
                "execute_calls", "cpu_fallbacks"):
        assert key in m
    assert m["ops_recorded"] >= 2 and m["execute_calls"] >= 1
    deferfuse.reset_metrics()
    assert deferfuse.metrics()["ops_recorded"] == 0


def test_set_default_mode_and_env_names():
    assert deferfuse.get_default_mode() == deferfuse.EagerMode.STRICT
    deferfuse.set_default_mode("defer_and_fuse")
    try:
        y = torch.ones(3, device="tpu") * 4
        assert pending.pending_count() > 0
        assert y.cpu().tolist() == [4.0, 4.0, 4.0]
    finally:
        deferfuse.set_default_mode(deferfuse.EagerMode.DEFER_NEVER)
    assert deferfuse.get_default_mode() == deferfuse.EagerMode.STRICT
    with pytest.raises(ValueError):
        deferfuse.mode("fast")


def test_sync_waits_for_programs_already_dispatched():
    """Leaving the block dispatches the last program asynchronously; deferfuse.sync() (like
    torch.cuda.synchronize) must still wait for it even though nothing is pending any more."""
    x = torch.randn(512, 512, device="tpu")
    with deferfuse.mode():
        y = x
        for _ in range(12):
            y = torch.tanh(y @ x)
    # the mode_exit flush ran the program asynchronously; nothing is pending now
    assert deferfuse.metrics()["pending_nodes"] == 0
    deferfuse.sync()
    assert y._st.value.is_ready()


def test_a_loop_that_never_syncs_accumulates_no_objects():
    """Nothing deferfuse keeps may grow with the steps of a loop: each object that outlives a
    step is promoted by Python's GC, and enough promotions set off a full collection of the
    process (hundreds of ms). A weakref per program output, kept for `sync()` until the next
    one, was 160 such objects a step of a small GPT."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8).to("tpu")

    def steps(n):
        for _ in range(n):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()

    with deferfuse.mode():
        steps(4)
        gc.collect()
        gc.disable()
        try:
            steps(2)  # the loop's objects as they are between steps
            before = len(gc.get_objects())
            steps(30)
            grew = len(gc.get_objects()) - before
        finally:
            gc.enable()
        deferfuse.sync()
    assert grew < 30, f"{grew} more objects after 30 more steps"


def test_a_memory_error_while_adding_a_node_leaves_the_graph_as_it_was():
    """A node and its key entry are added together or not at all: a node without its entry in the
    key would make the flush's key name another program."""
    class FullList(list):
        def append(self, item):
            raise MemoryError

    op = Op(("test", "add"), "test_add", lambda ins, scs: ins, [((2,), np.float32)], 1)
    g = Graph()
    g.add(op, (-1,), [0.5], None)
    g.sig = FullList(g.sig)
    with pytest.raises(MemoryError):
        g.add(op, (0,), [2.0], None)
    assert (len(g.nodes), len(g.sig), g.scalars) == (1, 1, [0.5])


_FAILING_FALLBACKS = {
    # CPU fallbacks whose kernel refuses the data, found only when they run
    "put_ past the end": lambda x: x.put_(torch.tensor([10]).to(x.device), torch.tensor([1.0]).to(x.device)),
    "masked_scatter_ short source": lambda x: x.masked_scatter_(torch.ones(3, dtype=torch.bool).to(x.device),
                                                                 torch.tensor([1.0]).to(x.device)),
}


@pytest.mark.parametrize("case", sorted(_FAILING_FALLBACKS))
@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_a_failing_in_place_fallback_leaves_its_target_as_it_was(case, mode):
    """On CPU the op raises and the tensor is unchanged. On tpu a step before the host op had
    donated the tensor's buffer, so the tensor was unusable afterwards ('Array has been
    deleted'), and the error was a FlushError only, where CPU raises IndexError for put_."""
    with pytest.raises(Exception) as cpu:
        _FAILING_FALLBACKS[case](torch.arange(3.0))
    x = torch.arange(3.0).to("tpu")
    with deferfuse.mode(mode):
        with pytest.raises(type(cpu.value)):
            _FAILING_FALLBACKS[case](x)
    torch.testing.assert_close(x.cpu(), torch.arange(3.0))


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_set_default_dtype_is_followed_after_a_call_was_cached(mode):
    """deferfuse caches what a call makes under its signature, which does not name the default
    dtype: after set_default_dtype, factories and int-to-float promotions kept the old one."""
    calls = {
        "ones": lambda d: torch.ones(2, device=d),
        "full": lambda d: torch.full((2,), 1.5, device=d),
        "randn": lambda d: torch.randn(2, device=d),
        "arange float": lambda d: torch.arange(0.0, 2.0, device=d),
        "int / 2": lambda d: torch.arange(3, device=d) / 2,
        "int / int": lambda d: torch.arange(3, device=d) / torch.arange(1, 4, device=d),
        "int sqrt": lambda d: torch.arange(3, device=d).sqrt(),
        "Linear": lambda d: torch.nn.Linear(2, 2, device=d).weight,
    }
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            with deferfuse.mode(mode):
                got = {k: f("tpu").dtype for k, f in calls.items()}
            assert got == {k: f("cpu").dtype for k, f in calls.items()} == dict.fromkeys(calls, default)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("call", [
    lambda t: torch.zeros_like(t, device="cpu"),
    lambda t: torch.ones_like(t, device="cpu", dtype=torch.int64),
    lambda t: torch.full_like(t, 2.0, device="cpu"),
    lambda t: t.new_empty((2,), device="cpu").fill_(3.0),
    lambda t: t.new_zeros((2, 2), device="cpu"),
], ids=["zeros_like", "ones_like", "full_like", "new_empty", "new_zeros"])
def test_a_result_asked_for_on_cpu_is_made_there(call):
    """zeros_like, ones_like, full_like and new_empty of a tpu tensor ignored device="cpu"."""
    t = torch.arange(6.0).reshape(2, 3)
    want = call(t)
    got = call(t.to("tpu"))
    assert got.device.type == "cpu" and got.dtype == want.dtype
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("call", [
    lambda: torch.zeros(2, device="tpu:1"),
    lambda: torch.ones(2).to("tpu:1"),
    lambda: torch.nn.Linear(2, 2).to("tpu:1"),
    lambda: torch.tensor([1.0, 2.0], device="tpu:1"),
], ids=["factory", "to", "module.to", "tensor"])
def test_a_device_index_past_the_one_device_raises(call):
    """tpu:1 quietly became tpu:0; CUDA with one device refuses an invalid ordinal."""
    with pytest.raises(RuntimeError, match="tpu:1 does not exist"):
        call()
    assert torch.zeros(2, device="tpu:0").device == torch.device("tpu", 0)


_CPU_BESIDE_TPU = {
    "searchsorted values": lambda s, v: torch.searchsorted(s.to("tpu"), v),
    "searchsorted sorted": lambda s, v: torch.searchsorted(s, v.to("tpu")),
    "bucketize boundaries": lambda s, v: torch.bucketize(v.to("tpu"), s),
    "bucketize input": lambda s, v: torch.bucketize(v, s.to("tpu")),
    "bincount weights": lambda s, v: torch.bincount(torch.tensor([0, 1, 1, 3]).to("tpu"), weights=s),
}


@pytest.mark.parametrize("case", sorted(_CPU_BESIDE_TPU))
def test_a_cpu_tensor_beside_tpu_ones_in_a_cpu_fallback_raises_a_device_error(case):
    """A CPU fallback copied the tpu tensors to the host and took the CPU one as it was; CUDA
    refuses it."""
    s, v = torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.tensor([0.5, 2.5, 0.0, 3.0])
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        _CPU_BESIDE_TPU[case](s, v)


def test_writing_a_cpu_scalar_tensor_from_a_tpu_one_raises_a_device_error():
    """`cpu_0dim.add_(tpu_0dim)` raised AttributeError ('_st'), an internal attribute."""
    x = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x.add_(torch.ones((), device="tpu"))
    assert x.item() == 1.0
