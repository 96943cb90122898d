"""Every DeferAndFuse flush trigger records its cause and the user's file:line."""
from __future__ import annotations

import contextlib
import copy
import inspect
import io
from contextlib import redirect_stdout

import pytest
import torch

import deferfuse
from deferfuse import cache, fuser, lanes, sources
from deferfuse.config import CONFIG
from conftest import MODES, check_raises_like_cpu

HERE = __file__


def _line_of(marker: str) -> int:
    src, start = inspect.getsourcelines(inspect.currentframe().f_back.f_code)
    for i, text in enumerate(src):
        if marker in text:
            return start + i
    raise AssertionError(marker)


def _flushes(evs):
    return [e for e in evs() if e["kind"] == "flush"]


def _assert_flush(evs, cause: str, line: int):
    fl = [e for e in _flushes(evs) if e["cause"] == cause]
    assert fl, f"no {cause!r} flush; got {[e['cause'] for e in _flushes(evs)]}"
    filename, lineno, _ = sources.parts(fl[-1]["where"])
    assert filename == HERE and lineno == line, f"{cause} recorded at {filename}:{lineno}, expected line {line}"
    assert deferfuse.metrics()["flushes_by_cause"].get(cause, 0) >= 1


def pending():
    x = torch.ones(4, device="tpu")
    return (x * 3 + 1).sum()


def test_item(events):
    with deferfuse.mode():
        s = pending()
        s.item()  # <- item
        _assert_flush(events, "item", _line_of("# <- item"))


def test_local_scalar_dense_via_tolist_and_cpu(events):
    with deferfuse.mode():
        s = pending()
        s.tolist()  # <- tolist
        _assert_flush(events, "tolist", _line_of("# <- tolist"))
        t = pending()
        t.cpu()  # <- cpu
        _assert_flush(events, "to_cpu", _line_of("# <- cpu"))
        u = pending()
        u.to("cpu").numpy()  # <- to cpu
        _assert_flush(events, "to_cpu", _line_of("# <- to cpu"))


def test_print_and_repr(events):
    with deferfuse.mode():
        s = pending()
        with redirect_stdout(io.StringIO()) as out:
            print(s)  # <- print
        assert "device='tpu:0'" in out.getvalue()
        _assert_flush(events, "print", _line_of("# <- print"))
        r = pending()
        repr(r)  # <- repr
        _assert_flush(events, "print", _line_of("# <- repr"))


def test_bool_int_float(events):
    with deferfuse.mode():
        s = pending()
        if s > 0:  # <- bool
            pass
        _assert_flush(events, "bool", _line_of("# <- bool"))
        n = pending()
        int(n)  # <- int
        _assert_flush(events, "int", _line_of("# <- int"))
        f = pending()
        float(f)  # <- float
        _assert_flush(events, "float", _line_of("# <- float"))


def test_data_dependent_shapes(events):
    with deferfuse.mode():
        x = torch.arange(6.0, device="tpu") - 2
        torch.nonzero(x)  # <- nonzero
        _assert_flush(events, "data_dependent", _line_of("# <- nonzero"))
        y = torch.arange(6.0, device="tpu") - 2
        y[y > 0]  # <- mask index
        _assert_flush(events, "data_dependent", _line_of("# <- mask index"))
        z = torch.arange(6.0, device="tpu") * 2
        torch.masked_select(z, z > 3)  # <- masked_select
        _assert_flush(events, "data_dependent", _line_of("# <- masked_select"))
        w = torch.tensor([3, 1, 3, 2], device="tpu") + 0
        u = torch.unique(w)  # <- unique
        _assert_flush(events, "data_dependent", _line_of("# <- unique"))
        assert u.cpu().tolist() == [1, 2, 3]


def test_explicit_syncs(events):
    with deferfuse.mode():
        pending()
        deferfuse.sync()  # <- sync
        _assert_flush(events, "sync", _line_of("# <- sync"))
        pending()
        torch.tpu.synchronize()  # <- synchronize
        _assert_flush(events, "synchronize", _line_of("# <- synchronize"))


def test_leaving_the_block(events):
    with deferfuse.mode():  # <- block
        keep = pending()  # noqa: F841
    fl = [e for e in _flushes(events) if e["cause"] == "mode_exit"]
    assert fl
    filename, lineno, _ = sources.parts(fl[-1]["where"])
    # Python reports the end of a with-block at the with statement or the block's last line
    assert filename == HERE and lineno in (_line_of("# <- block"), _line_of("# <- block") + 1)


def test_size_cap(events, monkeypatch):
    monkeypatch.setattr(CONFIG, "max_pending", 20)
    lookback = deferfuse.pending.PENDING.period.lookback
    deferfuse.pending.PENDING.period.lookback = 0  # no repetition detection: only the cap cuts
    try:
        with deferfuse.mode():
            x = torch.ones(3, device="tpu")
            for i in range(25):
                x = x * 1.5 + i  # <- capped
            _assert_flush(events, "size_cap", _line_of("# <- capped"))
            assert deferfuse.metrics()["max_pending"] <= 20
    finally:
        deferfuse.pending.PENDING.period.lookback = lookback


def test_repeated_op_heuristic(events):
    with deferfuse.mode():
        x = torch.ones(3, device="tpu")
        for i in range(200):
            x = torch.tanh(x * 1.01 + 0.5)  # <- loop body
        _assert_flush(events, "repeated_op_heuristic", _line_of("# <- loop body"))
        assert deferfuse.metrics()["max_pending"] < 200


def test_optimizer_step_cuts_before_the_next_op(events):
    """A training step ends where its optimizer's step() returns; the cut runs just before the
    next op, once zero_grad() has dropped the gradients, so they are not program outputs; a sync
    point first takes the step's graph itself and nothing is cut twice."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(16, 4).to("tpu")
    n_params = len(list(model.parameters()))

    def step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()  # <- step
        opt.zero_grad()
        return loss

    with deferfuse.mode():
        step()
        assert deferfuse.metrics()["pending_nodes"] > 0  # owed, not yet taken
        out0 = deferfuse.metrics()["outputs_materialized"]
        step()  # the step's first op takes the cut first
        _assert_flush(events, "optimizer_step", _line_of("# <- step"))
        # parameters, two AdamW states each, and nothing else: the gradients were dropped
        assert deferfuse.metrics()["outputs_materialized"] - out0 == 3 * n_params
        step()
        cuts = deferfuse.metrics()["flushes_by_cause"]["optimizer_step"]
        deferfuse.sync()  # a sync point before the next op takes the step's graph: no cut owed after
        x.neg()
        assert deferfuse.metrics()["flushes_by_cause"]["optimizer_step"] == cuts
    assert deferfuse.metrics()["pending_nodes"] == 0


def test_optimizer_step_in_strict_cuts_nothing():
    model = torch.nn.Linear(4, 1).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = deferfuse.metrics()["flushes_by_cause"].get("optimizer_step", 0)
    with deferfuse.mode("strict"):
        model(torch.ones(2, 4, device="tpu")).sum().backward()
        opt.step()
        torch.ones(1, device="tpu").neg()
    assert deferfuse.metrics()["flushes_by_cause"].get("optimizer_step", 0) == before


def test_flush_takes_all_live_pending_tensors():
    with deferfuse.mode():
        a = torch.ones(3, device="tpu") * 2
        b = torch.ones(3, device="tpu") + 5
        a.sum().item()
        m = deferfuse.metrics()
        assert m["pending_nodes"] == 0
        assert b._st.value is not None  # b was computed by the same flush


def _blocks(x, ws):
    for w in ws:  # one block: 8 recorded ops, a period long enough to be cut at every repetition
        h = torch.tanh(x @ w)
        h = h * 0.5 + x
        h = torch.sigmoid(h) - 0.25
        x = x + h.relu()
    return x.sum()


def test_repeated_blocks_compile_once_whatever_the_depth(monkeypatch):
    """A deeper stack of identical blocks builds no more programs than a shallow one: the fuser
    gives each repetition its own group and identical groups share one jitted program."""
    monkeypatch.setattr(CONFIG, "fuse_block_ops", 8)  # a block here is 8 ops
    built = {}
    for depth, width in ((6, 5), (16, 6)):  # a fresh width per depth: nothing cached in advance
        torch.manual_seed(depth)
        ws = [torch.randn(width, width) * 0.3 for _ in range(depth)]
        x = torch.randn(3, width)
        m0 = deferfuse.metrics()
        with deferfuse.mode():
            got = _blocks(x.to("tpu"), [w.to("tpu") for w in ws])
            got = got.cpu()
        m1 = deferfuse.metrics()
        built[depth] = m1["programs_built"] - m0["programs_built"]
        assert m1["execute_calls"] - m0["execute_calls"] >= depth  # one program run per block
        torch.testing.assert_close(got, _blocks(x, ws))
    assert 0 < built[16] <= built[6], built


@pytest.mark.parametrize("fused", [False, True])
def test_optimizer_update_of_repeated_layers_shares_programs(fused):
    """A foreach optimizer (or a fused one's single kernel) over many identical layers splits its
    lists at layer boundaries, and the result is AdamW's on CPU. A foreach step's per-layer chain
    is a program of its own, one program for all of them; a fused step's is two nodes (the step
    counter and the kernel), shorter than a lane worth a program (fuser.MIN_LANE_NODES)."""
    torch.manual_seed(0)
    known = set(cache._PLANS)  # plans compiled before this test are not its own
    layers = 10
    cpu = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)])
    tpu = copy.deepcopy(cpu).to("tpu")
    how = {"fused": True} if fused else {"foreach": True}
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1, **how) for m in (cpu, tpu)]
    x = torch.randn(2, 4)
    for step in range(3):
        for m, opt, xx in ((cpu, opts[0], x), (tpu, opts[1], x.to("tpu"))):
            ctx = deferfuse.mode() if m is tpu else contextlib.nullcontext()
            with ctx:
                m(xx).square().sum().backward()
                before = deferfuse.metrics()["ops_recorded"]
                opt.step()
                recorded = deferfuse.metrics()["ops_recorded"] - before
                opt.zero_grad()
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.cpu(), a)
    assert lanes.chunks(list(tpu.parameters())) == [(k, k + 2) for k in range(0, 2 * layers, 2)]
    # per plan of this test: one, the first step's too (its new optimizer state is made apart,
    # executors/optimizer_state.py), so the step's lanes are one plan's
    lanes_of = [[s for s in p.steps if s.group.why == "repeated lanes"] for k, p in cache._PLANS.items()
                if k not in known]
    if fused:  # the step counters' _foreach_add_ and the kernel, each split per layer (unsplit: 2)
        assert recorded == 2 * layers, recorded
        assert 2 < fuser.MIN_LANE_NODES and not any(lanes_of)
    else:  # a program per layer, one jitted program for all of a plan's layers
        assert [len(g) for g in lanes_of if g] == [layers]
        assert all(len({id(s.fn.fn) for s in g}) == 1 for g in lanes_of if g)


def test_backward_ops_are_attributed_to_each_backward_call(events, monkeypatch):
    # autograd records backward ops on its own thread; they name the line that called
    # backward(), looked up once per backward call, so a second call must not inherit the first's
    monkeypatch.setattr(CONFIG, "max_pending", 8)
    x = torch.ones(64, device="tpu", requires_grad=True)
    with deferfuse.mode():
        (x * 2).sin().cos().exp().sin().cos().sum().backward()  # <- first
        first = [e for e in _flushes(events) if e["cause"] == "size_cap"]
        (x * 3).sin().cos().exp().sin().cos().sum().backward()  # <- second
        second = [e for e in _flushes(events) if e["cause"] == "size_cap"][len(first):]
    lines = {name: {sources.parts(e["where"])[:2] for e in evs} for name, evs in (("first", first), ("second", second))}
    assert (HERE, _line_of("# <- first")) in lines["first"]
    assert (HERE, _line_of("# <- second")) in lines["second"]
    assert (HERE, _line_of("# <- first")) not in lines["second"]


@pytest.mark.parametrize("mode", MODES)
def test_assert_async_checks_its_condition(mode):
    """torch._assert_async has no output: recorded as a node it was dead and never ran, so the
    assert never fired. It is a sync point ("assert") and raises CPU's error."""
    for cond, msg in ((torch.tensor(0), ()), (torch.tensor(False), ("my message",))):
        check_raises_like_cpu(lambda d: torch._assert_async(cond.to(d) * 1, *msg), mode)
    with deferfuse.mode(mode):
        torch._assert_async(torch.tensor(3).to("tpu"))
        torch._assert_async(torch.tensor(True).to("tpu") & True, "fine")


@pytest.mark.parametrize("mode", MODES)
def test_linspace_and_logspace_read_tensor_ends_as_cpu_does(mode):
    """PyTorch's kernel reads 0-dim tensor ends with item() and makes the result where the call
    says: tpu ends with a CPU result, CPU ends with a tpu result, a pending end (a sync point),
    and CPU's error for an end that is not 0-dim. Recording its decomposition mixed the tpu ends
    into a CPU computation and raised a device mismatch."""
    for fn in (torch.linspace, torch.logspace):
        want = fn(torch.tensor(1.0), torch.tensor(3.0), 5)
        with deferfuse.mode(mode):
            ends = torch.tensor(1.0).to("tpu"), torch.tensor(1.5).to("tpu") * 2
            on_cpu = fn(*ends, 5)
            on_tpu = fn(torch.tensor(1.0), 3.0, 5, device="tpu")
            out = torch.empty(5, device="tpu")
            fn(1.0, ends[1], 5, out=out)
            assert on_cpu.device.type == "cpu" and on_tpu.device.type == "tpu"
            for got in (on_cpu, on_tpu, out):
                torch.testing.assert_close(got.cpu(), want)
        check_raises_like_cpu(lambda d, fn=fn: fn(torch.tensor([1.0]).to(d), torch.tensor(2.0), 3), mode)
        check_raises_like_cpu(lambda d, fn=fn: fn(1.0, torch.tensor([2.0, 3.0]).to(d), 3), mode)


def test_torch_accelerator_synchronize_flushes_and_waits(events):
    """torch.accelerator.synchronize() raised 'Backend doesn't support synchronizing all
    streams'; with tpu the current accelerator, it is torch.tpu.synchronize()."""
    assert torch.accelerator.current_accelerator().type == "tpu"
    with deferfuse.mode():
        y = torch.ones(3).to("tpu") * 2
        torch.accelerator.synchronize()  # <- accelerator
        _assert_flush(events, "synchronize", _line_of("# <- accelerator"))
        assert y._st.value is not None
