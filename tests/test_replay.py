"""DeferAndFuse feeds a training step from the trace of the step before (executors/replay.py).

A replayed step must build the graph recording would have built: the same results as CPU, and no
program compiled that recording would not compile. Every step that differs from its trace
(another shape, another branch, a new sync point, other scalars, aliased arguments) is recorded
from the first difference on, and still matches CPU in every mode. Random ops replay:
test_replay_random.py.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES, check_all_modes
from deferfuse.config import CONFIG
from deferfuse.executors.base import EagerMode
from deferfuse.modes import EXECUTORS
from deferfuse.pending import PENDING

pytestmark = pytest.mark.tpu_tolerance(
    times=8, why="six AdamW steps through bf16-pass matmuls: up to 4.0e-5 absolute on a loss of 1.38 at 81c49bc, 3.4 "
                 "times the CPU tolerance, in Strict first (which never replays)")


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.LayerNorm(8),
                               torch.nn.Linear(8, 3)).to(device)


def _loop(device, steps=6, extra=None, batch=lambda i: 5, clip=True):
    """A small training loop with AdamW; `extra(i, model, x, loss)` may change step i. Returns the
    losses, read after the loop, and the parameters."""
    model = _model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(steps):
        x = torch.randn(batch(i), 6, generator=g).to(device)
        t = torch.randint(0, 3, (batch(i),), generator=g).to(device)
        loss = F.cross_entropy(model(x), t)
        if extra is not None:
            loss = extra(i, model, x, loss)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses), [p.detach() for p in model.parameters()]


def _replayed() -> int:
    return deferfuse.metrics()["ops_replayed"]


def test_a_loop_replays_its_steps_and_matches_cpu():
    deferfuse.cache.clear()
    EXECUTORS[EagerMode.DEFER_AND_FUSE].replay.forget()  # other tests' traces
    cpu = _loop("cpu")
    with deferfuse.mode():
        got = _loop("tpu")
        got = (got[0].cpu(), [p.cpu() for p in got[1]])
    torch.testing.assert_close(got, cpu)
    m = deferfuse.metrics()
    # steps 1 and 2 are recorded (the first ends where no trace began, the second is traced);
    # the other four are replayed, but for the ops run again as they are (the batch's copies
    # to the device) and those recorded and checked (AdamW's bias corrections change each step)
    # (the step is 44 top-level calls: its forward, backward, clipping and AdamW's foreach calls)
    steady = EXECUTORS[EagerMode.DEFER_AND_FUSE].replay.traces.values()
    assert any(len(t) == 44 for t in steady), [len(t) for t in steady]
    assert m["ops_replayed"] >= 4 * (44 - 8), m["ops_replayed"]
    assert m["flushes_by_cause"].get("optimizer_step") == 6  # each step cut before the op after it


def test_a_replayed_step_builds_the_graph_recording_builds():
    deferfuse.cache.clear()
    CONFIG.replay, was = False, CONFIG.replay
    try:
        with deferfuse.mode():
            off = _loop("tpu")[0].cpu()
    finally:
        CONFIG.replay = was
    assert _replayed() == 0
    deferfuse.reset_metrics()
    with deferfuse.mode():
        on = _loop("tpu")[0].cpu()
    assert _replayed() > 0
    # every flush found the program recording had compiled: the same graphs, node for node
    assert deferfuse.metrics()["programs_compiled"] == 0
    torch.testing.assert_close(on, off, rtol=0, atol=0)


VARIANTS = {
    # another shape from step 4 on
    "shape": dict(batch=lambda i: 5 if i < 4 else 7),
    # another branch every third step
    "branch": dict(extra=lambda i, m, x, loss: loss + 0.1 * x.abs().mean() if i % 3 == 2 else loss),
    # a new sync point inside step 3
    "item": dict(extra=lambda i, m, x, loss: loss * (1.0 + 0.01 * (loss.item() > 0)) if i == 3 else loss),
    # a sync point every step, before the optimizer's: the trace goes on past it
    "item_every_step": dict(extra=lambda i, m, x, loss: loss * (2.0 if loss.item() > 0 else 1.0)),
    # a sync point every step whose value takes the other branch from step 4 on
    "branch_on_a_read": dict(extra=lambda i, m, x, loss: loss.exp() if bool((x.sum() > 0) == (i < 4)) else loss),
    # a Python scalar that changes every step: recorded again, checked, replayed on
    "scalar": dict(extra=lambda i, m, x, loss: loss * (1.0 + 0.01 * i)),
    # -0.0 and 0.0 are equal but not the same scalar
    "signed_zero": dict(extra=lambda i, m, x, loss: loss + (1.0 / (x.sum() * 0.0 * (-1) ** i)).clamp(-1, 1)),
    # an in-place view changes a tensor's metadata
    "inplace_view": dict(extra=lambda i, m, x, loss: loss + x.clone().t_().sum() * 0.01),
    # a step without clipping
    "no_clip": dict(clip=False),
    # a CPU scalar tensor (a program scalar): the same value every step, then another every step,
    # then a zero whose sign changes every step
    "cpu_scalar": dict(extra=lambda i, m, x, loss: loss / torch.tensor(2.0)),
    "cpu_scalar_changes": dict(extra=lambda i, m, x, loss: loss * torch.tensor(1.0 + 0.01 * i)),
    "cpu_scalar_signed_zero": dict(
        extra=lambda i, m, x, loss: loss + (1.0 / (x.sum() * torch.tensor(0.0 * (-1) ** i))).clamp(-1, 1)),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_step_that_differs_is_recorded_and_matches_cpu(name):
    check_all_modes(lambda d: _loop(d, steps=6, **VARIANTS[name]))


def _aliased(device):
    """An op that reads two storages in the traced steps and one storage twice later."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    outs = []
    for i in range(6):
        a = torch.randn(5, 6, generator=g).to(device)
        b = torch.randn(5, 6, generator=g).to(device)
        if i >= 4:
            b = a  # the same storage where the trace had two
        y = torch.add(a, b)
        acc = a.clone()
        acc.add_(b)  # a write into one argument that reads the other
        loss = model(y + acc).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        outs.append(loss.detach())
    return torch.stack(outs), [p.detach() for p in model.parameters()]


def test_arguments_aliased_unlike_the_trace_are_recorded():
    check_all_modes(_aliased)


def _inputs_aliased(device):
    """The trace reads two parameters; later steps pass one of them twice."""
    torch.manual_seed(0)
    w1 = torch.randn(4, 4).to(device).requires_grad_()
    w2 = torch.randn(4, 4).to(device).requires_grad_()
    opt = torch.optim.SGD([w1, w2], lr=0.1)
    outs = []
    for i in range(6):
        x = torch.ones(3, 4, device=device) * (0.1 * i + 0.1)
        second = w2 if i < 4 else w1
        loss = (x @ w1 + x @ second).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        outs.append(loss.detach())
    return torch.stack(outs), w1.detach(), w2.detach()


def test_a_parameter_passed_twice_where_the_trace_had_two_is_recorded():
    check_all_modes(_inputs_aliased)


def test_a_replayed_step_rebuilds_nothing_when_the_loop_block_is_per_step():
    """Each step in a block of its own (bench's runners): the block's exit flushes the step."""
    deferfuse.cache.clear()
    model = _model("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    x = torch.randn(5, 6).to("tpu")
    for i in range(6):
        with deferfuse.mode():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    deferfuse.sync()
    m = deferfuse.metrics()
    assert m["ops_replayed"] > 0
    assert m["programs_compiled"] == 1  # the step; the optimizer's state is made on the host
    assert m["fills_on_host"] == 1


def test_changing_the_default_dtype_forgets_the_traces():
    replay = EXECUTORS[EagerMode.DEFER_AND_FUSE].replay
    with deferfuse.mode():
        _loop("tpu", steps=3)
    assert replay.traces
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert not replay.traces
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "defer_and_fuse"])
def test_strict_and_debug_never_replay(mode):
    with deferfuse.mode(mode):
        _loop("tpu", steps=4)
    assert _replayed() == 0


def _scheduled(device):
    """A learning rate that a scheduler changes every other step: a scalar the replay learns to
    read from the optimizer's arguments."""
    model = _model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(3)).to(device)
    losses = []
    for _ in range(8):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.detach())
    return torch.stack(losses), [p.detach() for p in model.parameters()]


def test_a_scheduled_learning_rate_is_replayed_and_matches_cpu():
    check_all_modes(_scheduled)


def _uneven_steps(device):
    """Two parameters whose AdamW step counts part at step 3 (one gets no gradient there): bias
    corrections that were equal across the update's list, and are not any more."""
    torch.manual_seed(0)
    a = torch.randn(4, 4).to(device).requires_grad_()
    b = torch.randn(4, 4).to(device).requires_grad_()
    opt = torch.optim.AdamW([a, b], lr=0.1)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4)).to(device)
    losses = []
    for i in range(8):
        loss = (x @ a).square().mean() + ((x @ b).square().mean() if i != 3 else 0.0)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses), a.detach(), b.detach()


def test_scalars_that_were_equal_and_part_are_recorded_and_match_cpu():
    check_all_modes(_uneven_steps)


def _train_in_block(steps=4):
    """A loop whose mode block ends with its last step (nothing recorded after it), so the next
    block's first step begins a traced step."""
    model = _model("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with deferfuse.mode():
        for _ in range(steps):
            x = torch.randn(5, 6, generator=g).to("tpu")
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


def test_a_new_loops_first_step_still_makes_its_optimizer_state_apart():
    """The trace of the loop before (same code, same shapes) must not replay the new optimizer's
    first step: its state's fills are made apart, and every step is one program."""
    # one step a loop: the second loop's first step is traced (the first's begins no trace), and
    # its trace, the state's fills in it, is the one the third loop's first step finds
    for _ in range(2):
        _train_in_block(steps=1)
    deferfuse.reset_metrics()
    _train_in_block(steps=1)
    m = deferfuse.metrics()
    assert m["flushes_by_cause"].get("optimizer_state") == 1, m["flushes_by_cause"]
    assert m["programs_compiled"] == 0  # the loops before compiled the same programs
    assert m["ops_replayed"] > 0


def test_a_sync_inside_a_step_writes_out_only_live_values(events):
    """The ops after an optimizer's step are traced as the next step, and the trace holds every
    storage it names; a sync point inside that step must still write out only the values
    something holds (here the one sum), as it does outside a step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with deferfuse.mode("defer_and_fuse"):
        for _ in range(2):
            model(torch.ones(3, 4).to("tpu")).sum().backward()
            opt.step()
            opt.zero_grad()
        x = torch.arange(8.0, device="tpu")
        y = torch.exp(x * 2 + 1).sum()
        del x
        value = y.item()
    flush = [e for e in events() if e["kind"] == "flush"][-1]
    assert flush["outputs"] == 1, flush
    assert value == pytest.approx(torch.exp(torch.arange(8.0) * 2 + 1).sum().item(), rel=1e-5)


def test_an_op_that_flushes_where_its_trace_did_not_is_recorded_and_matches_cpu():
    """Step 4 copies a value to the host where the trace converted it on the device: the same op
    (`_to_copy`), now a sync point. The replay ends at the flush, and the period detector is left
    counting the new graph's nodes (it counted the old graph's, and the op after raised an
    IndexError from the detector)."""
    seen = []

    def extra(i, model, x, loss):
        z = x * 2.0
        where = {"device": "cpu"} if i == 4 else {}
        y = z.to(dtype=torch.float64, **where)  # one call site: the source line is the trace's
        if x.device.type == "tpu":
            seen.append((PENDING.pushed, len(PENDING.graph.nodes)))
        return loss + y.sum().to(loss.device, loss.dtype) * 0.01

    EXECUTORS[EagerMode.DEFER_AND_FUSE].replay.forget()
    cpu = _loop("cpu", extra=extra)
    with deferfuse.mode():
        got = _loop("tpu", extra=extra)
        got = (got[0].cpu(), [p.cpu() for p in got[1]])
    torch.testing.assert_close(got, cpu)
    assert deferfuse.metrics()["ops_replayed"] > 0
    assert all(pushed <= n for pushed, n in seen), seen


def test_a_step_with_a_sync_point_replays_past_it():
    """`loss.item()` between backward and the optimizer's step (logging, a model's `if mask.all()`):
    the flush ends a segment of the trace, not the trace; every step from the third replays all
    its ops but the read itself, which runs again."""
    def loop(device):
        return _loop(device, extra=lambda i, m, x, loss: loss * (2.0 if loss.item() > 0 else 1.0))

    EXECUTORS[EagerMode.DEFER_AND_FUSE].replay.forget()
    cpu = loop("cpu")
    deferfuse.reset_metrics()
    with deferfuse.mode():
        got = loop("tpu")
        got = (got[0].cpu(), [p.cpu() for p in got[1]])
    torch.testing.assert_close(got, cpu)
    m = deferfuse.metrics()
    trace = max(EXECUTORS[EagerMode.DEFER_AND_FUSE].replay.traces.values(), key=len)
    syncs = [e.func for e in trace if e.sync]
    assert syncs == [torch.ops.aten._local_scalar_dense.default], syncs
    # the 44 calls of the loop's step, the read, the multiplication and its backward; steps 3 to
    # 6 replay all but the read, the batch's copies and AdamW's bias corrections (recorded and
    # checked)
    assert len(trace) == 47, len(trace)
    assert m["ops_replayed"] >= 4 * (47 - 1 - 8), m["ops_replayed"]
    assert m["flushes_by_cause"]["item"] == 6


def test_a_cpu_scalar_tensor_argument_is_replayed_as_a_python_number_is():
    """`x / torch.tensor(d)` (DeBERTa's log buckets) takes the scalar's value into the program:
    the trace matches it by value and goes on, as it does for `x / d`."""
    replay = EXECUTORS[EagerMode.DEFER_AND_FUSE].replay
    counts = []
    for divisor in (2.0, torch.tensor(2.0)):
        replay.forget()
        deferfuse.reset_metrics()
        with deferfuse.mode():
            got = _loop("tpu", extra=lambda i, m, x, loss: loss / divisor)[0].cpu()
        trace = max(replay.traces.values(), key=len)
        counts.append((len(trace), _replayed()))
        torch.testing.assert_close(got, _loop("cpu", extra=lambda i, m, x, loss: loss / divisor)[0])
    assert counts[1] == counts[0], counts


def test_forget_leaves_no_step_due_so_earlier_work_cannot_change_the_traces():
    """An optimizer step that ended just before (another test's, another model's) left a step
    due: without `forget()` clearing it, the next model's build began a step of its own, and the
    traces a loop left depended on what ran before it."""
    replay = EXECUTORS[EagerMode.DEFER_AND_FUSE].replay
    kept = []
    for before in (False, True):
        with deferfuse.mode():
            if before:
                model = _model("tpu")
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                model(torch.randn(2, 6, device="tpu")).sum().backward()
                opt.step()
                assert replay.due
            replay.forget()
            _loop("tpu")[0].cpu()
        kept.append(sorted((str(func), len(entries)) for (func, _), entries in replay.traces.items()))
    assert kept[1] == kept[0], kept


def _two_models_one_step(device, steps=5):
    """Two models trained one after the other through one step function: their steps begin with
    the same op on the same line, the second's trace is cut short by an in-place view."""
    torch.manual_seed(0)
    first = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(device)
    second = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                 torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)).to(device)
    x = torch.randn(5, 6).to(device)
    losses = []
    replayed = []
    for model, view in ((first, False), (second, True)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = _replayed()
        for _ in range(steps):
            loss = model(x).square().mean()
            if view:
                loss = loss + x.clone().t_().sum() * 0.01  # an in-place view ends the trace here
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        replayed.append(_replayed() - before)
    return torch.stack(losses), replayed


def test_a_step_that_leaves_a_longer_trace_early_keeps_its_own_shorter_one():
    """The second model's steps find the first's trace under their first op and leave it at their
    second op: their own trace, cut short by the in-place view, replaces it (it was kept, longer,
    and every step replayed one op)."""
    EXECUTORS[EagerMode.DEFER_AND_FUSE].replay.forget()
    expected, _ = _two_models_one_step("cpu")
    with deferfuse.mode():
        got, replayed = _two_models_one_step("tpu")
        got = got.cpu()
    torch.testing.assert_close(got, expected)
    # from its third step on, the second model replays its forward pass (more than its 6 layers)
    assert replayed[1] >= 3 * 6, replayed
