"""nn.EmbeddingBag on tpu: values, gradients and auxiliary outputs against CPU, in every mode."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import deferfuse
from conftest import MODES, check_all_modes, check_raises_like_cpu

aten = torch.ops.aten
IDX = torch.tensor([1, 2, 4, 5, 4, 3, 0, 7, 7, 2])
OFFSETS = torch.tensor([0, 3, 3, 6, 9])  # bag 1 is empty
# bag 0 is all padding when padding_idx=1 and IDX starts [1, 1]
PADDED = torch.tensor([1, 1, 2, 4, 5, 4, 3, 0, 7, 7])


def _bag(d, mode, idx, offsets, padding_idx=None, include_last_offset=False, psw=False, scale=False):
    torch.manual_seed(0)
    w = torch.randn(9, 4, dtype=torch.float64).to(d).requires_grad_()
    weights = torch.rand(idx.shape, dtype=torch.float64).to(d).requires_grad_() if psw else None
    if include_last_offset and offsets is not None:
        offsets = torch.cat([offsets, torch.tensor([idx.numel()])])
    y = F.embedding_bag(idx.to(d), w, None if offsets is None else offsets.to(d), mode=mode,
                        padding_idx=padding_idx, include_last_offset=include_last_offset,
                        per_sample_weights=weights, scale_grad_by_freq=scale)
    (y * torch.arange(float(y.numel()), dtype=torch.float64).reshape(y.shape).to(d)).sum().backward()
    return [y, w.grad] + ([weights.grad] if psw else [])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 1])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_values_and_gradients(mode, padding_idx, include_last_offset):
    idx = PADDED if padding_idx is not None else IDX
    check_all_modes(lambda d: _bag(d, mode, idx, OFFSETS, padding_idx, include_last_offset))


@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_bag_per_sample_weights(padding_idx):
    check_all_modes(lambda d: _bag(d, "sum", IDX, OFFSETS, padding_idx, psw=True))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_2d_input(mode):
    check_all_modes(lambda d: _bag(d, mode, IDX[:8].reshape(2, 4), None))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq_where_cpu_is_right(mode):
    """Every index twice: CPU's count lookup (pytorch/pytorch#190063) cannot pick a wrong one."""
    idx = torch.tensor([3, 5, 3, 0, 5, 0])
    check_all_modes(lambda d: _bag(d, mode, idx, torch.tensor([0, 2, 2, 5]), scale=True))


def test_embedding_bag_scale_grad_by_freq_divides_by_each_index_frequency():
    """Mixed counts, where CPU 2.13 divides some rows by another index's count: the sum bag's
    gradient is the plain embedding's, whose CPU kernel counts correctly."""
    idx, offsets = torch.tensor([4, 4, 1, 2, 1, 7, 4]), torch.tensor([0, 2, 5])
    g = torch.randn(3, 4, dtype=torch.float64)
    want = torch.zeros(9, 4, dtype=torch.float64, requires_grad=True)
    per_index = F.embedding(idx, want, scale_grad_by_freq=True)
    bags = torch.stack([per_index[0:2].sum(0), per_index[2:5].sum(0), per_index[5:].sum(0)])
    (bags * g).sum().backward()
    for mode in MODES:
        w = torch.zeros(9, 4, dtype=torch.float64).to("tpu").requires_grad_()
        with deferfuse.mode(mode):
            y = F.embedding_bag(idx.to("tpu"), w, offsets.to("tpu"), mode="sum", scale_grad_by_freq=True)
            (y * g.to("tpu")).sum().backward()
        torch.testing.assert_close(w.grad.cpu(), want.grad, msg=lambda s, m=mode: f"[{m}] {s}")


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_idx", [-1, 4])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_auxiliary_outputs_are_cpus(mode, padding_idx, include_last_offset):
    """offset2bag, bag_size and max_indices: shapes, dtypes and values as CPU's kernel gives them
    (PyTorch's meta kernel disagrees on some shapes)."""
    w = torch.randn(9, 3)
    offsets = torch.cat([OFFSETS, torch.tensor([10])]) if include_last_offset else OFFSETS
    for dt in (torch.int64, torch.int32):
        args = (IDX.to(dt), offsets.to(dt), False, mode, False, None, include_last_offset, padding_idx)
        want = aten._embedding_bag.default(w, *args)
        with deferfuse.mode():
            got = aten._embedding_bag.default(w.to("tpu"), *[a.to("tpu") if isinstance(a, torch.Tensor) else a
                                                            for a in args])
            got = [t.cpu() for t in got]
        for g, e in zip(got, want):
            assert g.shape == e.shape and g.dtype == e.dtype
            torch.testing.assert_close(g, e)


def test_embedding_bag_training_step_records_without_fallback_or_flush():
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(50, 8, mode="mean").to("tpu")
    opt = torch.optim.SGD(bag.parameters(), lr=0.1)
    idx, offsets = torch.randint(0, 50, (40,)).to("tpu"), torch.tensor([0, 7, 19, 30]).to("tpu")
    deferfuse.reset_metrics()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU fallback warns
        with deferfuse.mode():
            for _ in range(3):
                bag(idx, offsets).square().sum().backward()
                opt.step()
                opt.zero_grad()
            m = deferfuse.metrics()
            assert not m["cpu_fallbacks"] and m["flushes_by_cause"].keys() <= {"repeated_op_heuristic", "optimizer_step"}


@pytest.mark.parametrize("idx, offsets", [
    ([1, 5], [0]),  # an index out of range
    ([1, 2, 3, 4], [1, 3]),  # offsets not starting at 0
    ([1, 2, 3, 4], [0, 3, 2]),  # decreasing
    ([1, 2, 3, 4], [0, 7]),  # past the end
])
def test_embedding_bag_debug_raises_cpus_error_for_bad_indices_or_offsets(idx, offsets):
    w, idx, offsets = torch.randn(5, 2), torch.tensor(idx), torch.tensor(offsets)
    check_raises_like_cpu(lambda d: F.embedding_bag(idx.to(d), w.to(d), offsets.to(d)), "debug")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("make", [lambda: torch.nn.Embedding(5, 3, sparse=True),
                                  lambda: torch.nn.EmbeddingBag(5, 3, sparse=True)], ids=["Embedding", "EmbeddingBag"])
def test_sparse_gradients_raise_from_backward(make, mode):
    """sparse=True builds a sparse gradient, which tpu cannot hold: a clear error from
    backward(). Raised inside PyTorch's backward it aborted the process (Strict, Debug) or
    failed at the next flush (DeferAndFuse)."""
    torch.manual_seed(0)
    e = make().to("tpu")
    idx = torch.tensor([[1, 2]]).to("tpu")
    with deferfuse.mode(mode):
        out = e(idx).sum()
        with pytest.raises(NotImplementedError, match="sparse=False"):
            out.backward()
        # the forward of a sparse=True module is dense, and runs
        torch.testing.assert_close(e(idx).cpu(), e.cpu()(idx.cpu()))
