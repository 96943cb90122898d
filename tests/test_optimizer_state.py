"""An optimizer's first step creates its state; DeferAndFuse makes that state by a program of its
own (executors/optimizer_state.py) and records decomposed ops' first calls as their later calls
(routes/expansion.py), so the first training step is the same program as every later one. And
wherever that cannot apply, the step is recorded as before and still matches CPU."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES, check_all_modes, train_toy


def _train(device, make_opt, steps=4, mode=None):
    """conftest's toy loop, clipped (clip_grad_norm_'s stack is a decomposed op: its first call
    is kept whole), in `mode`: its losses, parameters and optimizer."""
    losses = []

    def loss_of(out, t):
        losses.append(F.cross_entropy(out, t))
        return losses[-1]

    with deferfuse.mode(mode) if mode else contextlib.nullcontext():
        model, opt = train_toy(device, lambda: [torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)],
                               lambda ps: make_opt(ps, device), loss_of, steps=steps, clip=1.0)
    return losses, [p.detach() for p in model.parameters()], opt


def _xla_compiles() -> int:
    return deferfuse.metrics()["xla_compiles"]


OPTIMIZERS = {  # (parameters, device) -> optimizer
    "adamw_foreach": lambda ps, d: torch.optim.AdamW(ps, lr=0.05, foreach=True),
    "adam_single": lambda ps, d: torch.optim.Adam(ps, lr=0.05, foreach=False),
    # its step counters on the device, made by fills too (CPU's Adam refuses capturable)
    "adam_capturable": lambda ps, d: torch.optim.Adam(ps, lr=0.05, foreach=True, capturable=d != "cpu"),
    "adam_fused": lambda ps, d: torch.optim.Adam(ps, lr=0.05, fused=True),
    "rmsprop": lambda ps, d: torch.optim.RMSprop(ps, lr=0.01, momentum=0.9),
}


@pytest.mark.tpu_tolerance(times=4, why="four steps through bf16-pass matmuls and XLA:TPU's sqrt: 2.0e-5 absolute "
                                        "on a loss of 0.92 (AdamW) at d166f32, 1.8 times")
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_first_step_is_every_steps_program(name, events):
    deferfuse.cache.clear()
    cpu_losses, cpu_params, _ = _train("cpu", OPTIMIZERS[name])
    n0, p0 = _xla_compiles(), deferfuse.metrics()["programs_compiled"]
    losses, params, opt = _train("tpu", OPTIMIZERS[name], mode="defer_and_fuse")
    # XLA compiled what deferfuse counts and no more: the state's fills come out committed to
    # the device, as the step's own outputs do, so the second step's call finds the first's program
    assert _xla_compiles() - n0 == deferfuse.metrics()["programs_compiled"] - p0
    torch.testing.assert_close([x.cpu() for x in losses], cpu_losses)
    torch.testing.assert_close([p.cpu() for p in params], cpu_params)
    flushes = [e for e in events() if e["kind"] == "flush"]
    steps = [e for e in flushes if e["cause"] == "optimizer_step"]
    made = [e for e in flushes if e["cause"] == "optimizer_state"]
    # one program of fills, in the first step only, with every state tensor that step created
    n_state = sum(isinstance(v, torch.Tensor) and v.device.type == "tpu" for s in opt.state.values() for v in s.values())
    assert [e["nodes"] for e in made] == [n_state], made
    # the steps' flushes, the first's included, are one key: one whole-step program, compiled once
    assert len(steps) == 3 and len({e["key"] for e in steps}) == 1, steps
    assert [e["hit"] for e in steps] == [False, True, True]


def test_sgd_momentums_first_step_is_its_own(events):
    """SGD's momentum buffer starts as a copy of the gradient, not a fill: the first step is
    another computation, its own program, and the steps after it share one."""
    make = lambda ps, d: torch.optim.SGD(ps, lr=0.05, momentum=0.9)  # noqa: E731
    cpu_losses, cpu_params, _ = _train("cpu", make)
    losses, params, _ = _train("tpu", make, mode="defer_and_fuse")
    torch.testing.assert_close([p.cpu() for p in params], cpu_params)
    keys = [e["key"] for e in events() if e["kind"] == "flush" and e["cause"] == "optimizer_step"]
    assert len(keys) == 3 and keys[0] != keys[1] == keys[2]
    assert not [e for e in events() if e["kind"] == "flush" and e["cause"] == "optimizer_state"]


class _Odd(torch.optim.Optimizer):
    """State made in ways the fills' program must leave alone: a fill read back on the host before
    the update (a sync point between the fills and the op that reads them), a fill read in place
    at once, a buffer created and first used only in the next step, and a fill of a value that
    depends on a pending one (zeros_like of the gradient, pending in the step's graph)."""

    def __init__(self, params, sync: bool):
        super().__init__(params, {"lr": 0.1})
        self.sync = sync

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                s = self.state[p]
                if not s:
                    s["avg"] = torch.zeros_like(p)
                    s["later"] = torch.ones_like(p)
                    s["from_grad"] = torch.zeros_like(p.grad)
                    if self.sync:
                        assert s["avg"].abs().sum().item() == 0
                    s["avg"].add_(1.0)
                    s["first"] = True
                else:
                    s["later"].mul_(0.5)
                    s["first"] = False
                s["avg"].mul_(0.9).add_(p.grad, alpha=0.1)
                s["from_grad"].add_(p.grad)
                p.add_(s["avg"] + s["later"] * 0.01 + s["from_grad"] * 0.001, alpha=-group["lr"])


@pytest.mark.tpu_tolerance(times=3, why="three steps through bf16-pass matmuls: 1.01e-5 absolute on 0.077 at "
                                        "d166f32, 1.0 times")
@pytest.mark.parametrize("sync", [False, True])
def test_state_made_unusually_matches_cpu_in_every_mode(sync):
    def fn(d):
        losses, params, opt = _train(d, lambda ps, _: _Odd(ps, sync), steps=3)
        return losses, params, [v for s in opt.state.values() for k, v in sorted(s.items()) if k != "first"]

    check_all_modes(fn)


def test_a_fill_outside_a_step_stays_in_the_graph():
    """Only an optimizer's step makes fills apart: elsewhere a fill is a constant inside the
    program that uses it, as before."""
    with deferfuse.mode():
        z = torch.zeros(4, device="tpu")
        y = (z + 1).sum()
        assert deferfuse.metrics()["pending_nodes"] >= 2
        assert y.item() == 4
    assert deferfuse.metrics()["flushes_by_cause"].get("optimizer_state", 0) == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_decomposed_ops_first_call_records_one_node(mode):
    """The first call of a decomposed op is expanded and kept, and what it recorded is replaced
    by the kept node: its first call and its later calls record the same graph."""
    a = torch.randn(3, 7).to("tpu")
    b = torch.randn(3, 7).to("tpu")
    with deferfuse.mode(mode):
        got = []
        for _ in range(2):
            n0 = deferfuse.metrics()["pending_nodes"]
            got.append(torch.stack([a, b, a], dim=1))
            if mode == "defer_and_fuse":
                assert deferfuse.metrics()["pending_nodes"] - n0 == 1
        got = [x.cpu() for x in got]
    want = torch.stack([a.cpu(), b.cpu(), a.cpu()], dim=1)
    torch.testing.assert_close(got, [want, want])


def test_a_value_made_from_nothing_is_read_without_compiling_again():
    """A program with no committed input (a factory flushed alone) still returns values committed
    to the device: the program that reads one calls the same compiled program when it later reads
    its own output there instead (a KV cache made apart, then written by each decode step)."""
    w = torch.arange(42.0).reshape(7, 3, 2)
    want = torch.zeros(7, 3, 2)
    with deferfuse.mode():
        z = torch.zeros(7, 3, 2, device="tpu")
        deferfuse.sync()
        wt = w.to("tpu")
        n0, p0 = _xla_compiles(), deferfuse.metrics()["programs_compiled"]
        for _ in range(3):
            z = z * 0.5 + wt
            want = want * 0.5 + w
            deferfuse.sync()
        assert _xla_compiles() - n0 == deferfuse.metrics()["programs_compiled"] - p0 <= 1
        torch.testing.assert_close(z.cpu(), want)


@pytest.mark.tpu_tolerance(times=4, why="Adam steps through bf16-pass matmuls and XLA:TPU's sqrt, as the first test")
def test_a_step_read_on_the_host_before_the_optimizer_compiles_once():
    """`loss.item()` before `opt.step()` (a loop logging its loss) flushes: the update begins a
    graph, whose first nodes are the state's fills, each reading its parameter. Run apart, they
    left those parameters registered as the graph's first inputs, in the fills' order; later steps
    register them in the update's (Adam's reads its moments first), so the second step compiled
    the update again."""
    def train(device, mode=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        losses, programs = [], []
        with deferfuse.mode(mode) if mode else contextlib.nullcontext():
            for _ in range(4):
                before = deferfuse.metrics()["programs_compiled"]
                x, t = torch.randn(5, 6, generator=g).to(device), torch.randint(0, 3, (5,), generator=g).to(device)
                loss = F.cross_entropy(model(x), t)
                loss.backward()
                losses.append(loss.item())
                opt.step()
                opt.zero_grad()
                deferfuse.sync()
                programs.append(deferfuse.metrics()["programs_compiled"] - before)
        return losses, [p.detach().cpu() for p in model.parameters()], programs

    want, want_params, _ = train("cpu")
    got, params, programs = train("tpu", "defer_and_fuse")
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(params, want_params)
    assert programs[1:] == [0, 0, 0], programs
