"""Strict's fast path (record.run_now): an op whose inputs are all concrete runs from the compile
cache without the pending graph, views among its inputs included.

A view input (a transpose, a slice, an attention head split) is read inside the op's program, as a
flush of that op records it (`pending.tensor_ref`): the fast path builds the same key, reads and
all, so the program the op's first flush compiled is the one every later call runs. A GPT step
in Strict has about 40 such ops out of 124; each one used to go through a flush of its own.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import deferfuse
import gpt_train
from conftest import check_all_modes
from deferfuse import pending


def _inputs():
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(6, 8, generator=g), "c": torch.randn(8, 6, generator=g),
            "big": torch.randn(6, 12, generator=g), "v": torch.randn(8, generator=g),
            "w": torch.randn(5, 8, generator=g), "sq": torch.randn(6, 6, generator=g),
            "z": torch.randn(4, 3, dtype=torch.complex64, generator=g)}


CASES = {
    "a transpose": lambda a, c, big, v, w, sq, z: a.t() + c,
    "a slice at offset 0": lambda a, c, big, v, w, sq, z: big[:, :8] * a,
    "two slices of one storage at two offsets": lambda a, c, big, v, w, sq, z: big[:, 6:] - big[:, :6],
    "the same view twice": lambda a, c, big, v, w, sq, z: a.t() * a.t(),
    "a view and its own base": lambda a, c, big, v, w, sq, z: torch.mm(a.t(), a),
    "a base and its own view": lambda a, c, big, v, w, sq, z: torch.addcmul(sq, sq.t(), sq[0]),
    "a view of a view, made contiguous": lambda a, c, big, v, w, sq, z: a.view(2, 3, 8).transpose(0, 1).contiguous(),
    "a row": lambda a, c, big, v, w, sq, z: a[2] + v,
    "an expanded vector": lambda a, c, big, v, w, sq, z: v.expand(6, 8) * a,
    "a diagonal": lambda a, c, big, v, w, sq, z: big[:, :6].diagonal() + c[0, :6],
    "an empty slice": lambda a, c, big, v, w, sq, z: big[:, 4:4].sum(1),
    "a linear layer over a column slice": lambda a, c, big, v, w, sq, z: F.linear(big[:, 2:10], w),
    "several outputs": lambda a, c, big, v, w, sq, z: torch.max(a.t(), dim=1),
    "layer norm of a transpose": lambda a, c, big, v, w, sq, z: F.layer_norm(c.t(), (8,)),
    "a boolean view": lambda a, c, big, v, w, sq, z: (a > 0).t() & (c > 0),
    "an integer view": lambda a, c, big, v, w, sq, z: (a * 10).long().t() + 3,
    "an unfolded window": lambda a, c, big, v, w, sq, z: a.unfold(1, 3, 2) * 2,
    "as_strided at an offset": lambda a, c, big, v, w, sq, z: a.as_strided((3, 3), (9, 2), 1) + 1,
    "a dtype reinterpretation": lambda a, c, big, v, w, sq, z: a.view(torch.int32)[:, 1:3] + 1,
    "a complex tensor's transposed imaginary part": lambda a, c, big, v, w, sq, z: z.t().imag * 3,
    "view_as_real": lambda a, c, big, v, w, sq, z: torch.view_as_real(z) * 2,
}


def _flushes(monkeypatch) -> list:
    """Counts the flushes that had nodes to run: a fast-path op leaves the pending graph empty."""
    seen = []
    real = pending._flush

    def counting(cause, where=None):
        if pending.PENDING.graph.nodes:
            seen.append([n.op.name for n in pending.PENDING.graph.nodes])
        return real(cause, where)

    monkeypatch.setattr(pending, "_flush", counting)
    return seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_op_with_view_inputs_runs_without_a_flush_once_compiled(case, monkeypatch):
    fn = CASES[case]
    data = _inputs()
    expected = fn(**data)
    flushes = _flushes(monkeypatch)
    with deferfuse.mode("strict"):
        # the views are made before the op: they are free, and the op alone is what runs
        args = {k: x.to("tpu") for k, x in data.items()}
        first = [t.cpu() for t in torch.utils._pytree.tree_leaves(fn(**args))]
        compiled = deferfuse.metrics()["cache_misses"]
        del flushes[:]
        second = fn(**args)
        assert flushes == [], f"the second call flushed {flushes}"
        assert deferfuse.metrics()["cache_misses"] == compiled
        second = [t.cpu() for t in torch.utils._pytree.tree_leaves(second)]
    expected = torch.utils._pytree.tree_leaves(expected)
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(second, expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_op_with_view_inputs_matches_cpu_in_every_mode(case):
    fn = CASES[case]

    def run(d):
        args = {k: x.to(d) for k, x in _inputs().items()}
        return [fn(**args), fn(**args)]

    check_all_modes(run)


def test_a_steady_gpt_step_flushes_only_its_optimizer_updates(monkeypatch):
    """Once the first step compiled them, a Strict GPT step's ops run from the cache, attention's
    head views and the loss's flattened logits among them: what still flushes is the optimizer's
    in-place updates (and the backward's seed, made on the host), no view read among them."""
    cfg = gpt_train.GPTConfig(vocab=32, seq=8, layers=2, heads=2, dim=16)
    torch.manual_seed(0)
    data = gpt_train.batches(cfg, 2)
    with deferfuse.mode("strict"):
        model = gpt_train.GPT(cfg).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        flushes = _flushes(monkeypatch)
        for _ in range(3):
            del flushes[:]
            x, y = next(data)
            loss = F.cross_entropy(model(x.to("tpu")).flatten(0, 1), y.to("tpu").flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
    ops = [name for names in flushes for name in names]
    assert any(n.startswith("aten._foreach_") for n in ops), flushes  # the count sees the flushes left
    assert not [n for n in ops if n.startswith("view")], flushes
    assert all(n.startswith("aten._foreach_") and n.endswith(("_", ".Scalar", ".ScalarList", ".List", ".Tensor"))
               or n == "aten.ones_like.default" for n in ops), flushes
