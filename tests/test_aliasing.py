"""Views and in-place ops alias exactly as on CPU, in every mode, across flushes. The index, mask and
value arguments CPU checks before such writes are in test_index_arguments.py."""
from __future__ import annotations

import warnings

import pytest
import torch

import deferfuse
from conftest import MODES, check_all_modes, check_raises_like_cpu


def base(device):
    return torch.arange(24, dtype=torch.float32).reshape(4, 6).to(device)


def case_slice_inplace(d):
    x = base(d)
    x[:, 1:3].mul_(10)
    return x


def case_select_add(d):
    x = base(d)
    x[2].add_(100)
    return x


def case_transpose_write(d):
    x = base(d)
    x.t()[1].fill_(-1)
    return x


def case_view_write(d):
    x = base(d)
    v = x.view(3, 8)
    v[1, 2:5] = 7
    return x, v


def case_diagonal(d):
    x = torch.zeros(5, 5).to(d)
    x.diagonal().copy_(torch.arange(5.0).to(d))
    x.diagonal(1).add_(3)
    return x


def case_unsqueeze_inplace(d):
    x = base(d)
    u = x.unsqueeze(0)
    u[0, 1, 1] = 42
    return x, u


def case_expand_read(d):
    x = torch.arange(3.0).to(d)
    e = x.unsqueeze(0).expand(4, 3)
    x.add_(1)  # the expanded view sees the update
    return e * 2


def case_base_updates_views(d):
    x = base(d)
    a = x[1]
    b = x[:, 2]
    x.zero_()
    x += 5
    return a, b


def case_two_views_same_storage(d):
    x = base(d)
    a = x[:, :3]
    b = x[:, 2:]
    a.mul_(2)  # column 2 is shared by a and b
    return a, b, x


def case_data_and_detach(d):
    x = base(d)
    y = x.detach()
    y[0, 0] = -5
    z = x.data
    z[3, 5] = 99
    return x, y, z


def case_copy_into_view(d):
    x = base(d)
    x[1:3, 1:4].copy_(torch.ones(2, 3).to(d) * 3)
    return x


def case_strided_step(d):
    x = torch.arange(20.0).to(d)
    x[::3] = 0
    x[1::4] += 100
    return x


def case_permute_contiguous(d):
    x = torch.arange(24.0).reshape(2, 3, 4).to(d)
    p = x.permute(2, 0, 1)
    c = p.contiguous()
    p[0, 0, 0] = -1
    return x, c, p


def case_inplace_chain_across_flush(d):
    x = base(d)
    v = x[1:, ::2]
    v.sub_(1)
    float(x.sum())  # a host read: flushes in DeferAndFuse
    v.mul_(3)
    return x


def case_narrow_unbind_split(d):
    x = base(d)
    rows = x.unbind(0)
    rows[1].neg_()
    parts = x.split(2, dim=1)
    parts[2].fill_(0.5)
    return x, x.narrow(1, 1, 3)


def case_setitem_index_tensor(d):
    x = base(d)
    idx = torch.tensor([0, 3]).to(d)
    x[idx] = torch.tensor(-2.0).to(d)
    x[:, idx] += 1
    return x


def case_masked_inplace(d):
    x = base(d)
    x[x > 10] = 0
    x.masked_fill_(x == 3, 33)
    return x


def case_clamp_inplace_view(d):
    x = base(d)
    x.view(-1)[5:15].clamp_(8, 12)
    return x


def case_squeeze_inplace_view(d):
    x = torch.arange(6.0).reshape(1, 6, 1).to(d)
    x.squeeze_()
    x.unsqueeze_(0)
    x.t_()
    x.mul_(2)
    return x, torch.tensor(list(x.shape))


def case_out_variant(d):
    x = base(d)
    out = torch.empty(4, 6).to(d)
    torch.add(x, 1, out=out)
    window = torch.empty(4, 3).to(d)
    torch.mul(x[:, :3], x[:, 3:], out=window)
    resized = torch.empty(0).to(d)
    torch.sub(x, 2, out=resized)  # an empty out is resized silently
    return out, window, resized


def case_composite_out_written_below_dispatcher(d):
    # linalg.matrix_rank's out= kernel stores its result with a C++ assignment no dispatch key
    # sees; deferfuse registers its own out= kernel (routes/out_kernels.py)
    torch.manual_seed(0)
    a = torch.randn(3, 4, 5)
    a[1, 3] = a[1, 0] + a[1, 1]  # rank 3
    a = a.to(d)
    plain = torch.full((3,), -1, dtype=torch.int64).to(d)
    torch.linalg.matrix_rank(a, out=plain)
    resized = torch.empty(0, dtype=torch.int64).to(d)
    torch.linalg.matrix_rank(a, atol=0.5, rtol=0.0, out=resized)
    window = torch.full((6,), -1.0).to(d)
    torch.linalg.matrix_rank(a, torch.tensor(1e-3).to(d), out=window[::2])
    return plain, resized, window


def case_repeated_inplace_then_views_of_the_same_layout(d):
    # from its second call on, an in-place signature makes the functional result the target's
    # value outright; views with the same size, stride and dtype must still write through
    x = torch.zeros(6).to(d)
    for _ in range(3):
        x.add_(1)
    rows = torch.zeros(4, 6).to(d)
    for i in range(4):
        rows[i].add_(i)
    flat = torch.zeros(6).to(d)
    alias = flat.view(6)
    alias.add_(2)
    alias.add_(2)
    return x, rows, flat


def case_repeated_foreach_inplace_into_a_view(d):
    a, b = torch.ones(3).to(d), torch.ones(3).to(d)
    for _ in range(3):
        torch._foreach_mul_([a, b], 2.0)
    grid = torch.ones(2, 3).to(d)
    torch._foreach_mul_([a, grid[1]], 3.0)
    torch._foreach_mul_([grid[1], b], 3.0)
    return a, b, grid


def case_cpu_scalar_tensor_changed_after_use(d):
    # a 0-dim CPU tensor next to tpu ones is read as a scalar (as CUDA does): its value at the
    # call, not at the flush (an LR scheduler fills the tensor lr a fused optimizer step used)
    c = torch.tensor(2.0)
    y = base(d) * c
    c.fill_(5.0)
    return y


CASES = [v for k, v in sorted(globals().items()) if k.startswith("case_")]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__[5:] for c in CASES])
def test_aliasing_matches_cpu(case):
    check_all_modes(case)


def test_at_least_fifteen_cases():
    assert len(CASES) >= 15


def test_view_of_pending_value_then_read_in_deferred():
    with deferfuse.mode():
        x = torch.ones(3, 4, device="tpu")
        y = x * 2
        row = y[1]
        row.add_(1)
        assert deferfuse.metrics()["pending_nodes"] > 0
        got = y.cpu()
    expected = torch.full((3, 4), 2.0)
    expected[1] += 1
    torch.testing.assert_close(got, expected)


_OVERLAPS = {
    "setitem shifted slice": lambda x: x.__setitem__(slice(1, None), x[:-1]),
    "add_ own transpose": lambda x: x[:4].view(2, 2).add_(x[:4].view(2, 2).T),
    "copy_ own transpose": lambda x: x[:4].view(2, 2).copy_(x[:4].view(2, 2).T),
    "add_ shifted slice": lambda x: x[1:].add_(x[:-1]),
    "sub_ own element": lambda x: x.sub_(x[0]),
    "mul_ own row": lambda x: x.view(2, 3).mul_(x.view(2, 3)[0]),
    "out= shifted slice": lambda x: torch.add(x[:-1], 1, out=x[1:]),
}


_DISJOINT_OR_SAME = {
    "add_ other column": lambda x: x.view(2, 3)[:, 0].add_(x.view(2, 3)[:, 1]),
    "add_ other row": lambda x: x.view(2, 3)[0].add_(x.view(2, 3)[1]),
    "add_ itself": lambda x: x.add_(x),
    "add_ same view": lambda x: x.view(2, 3).add_(x.view(2, 3)),
    "setitem disjoint slices": lambda x: x.__setitem__(slice(0, 2), x[3:5]),
}


@pytest.mark.parametrize("case", sorted(_OVERLAPS))
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_writing_a_view_from_a_partially_overlapping_view_raises_like_cpu(case, mode):
    """CPU refuses; deferfuse computed as if the input had been cloned first."""
    x = torch.arange(6.0).to("tpu")
    check_raises_like_cpu(lambda d: _OVERLAPS[case](torch.arange(6.0) if d == "cpu" else x), mode)
    torch.testing.assert_close(x.cpu(), torch.arange(6.0))  # untouched


def _check_write(write, n: int) -> None:
    """`write` into torch.arange(n) on each device gives CPU's result in every mode."""
    def run(d):
        x = torch.arange(float(n)).to(d)
        write(x)
        return x

    check_all_modes(run)


@pytest.mark.parametrize("case", sorted(_DISJOINT_OR_SAME))
def test_views_that_cpu_lets_write_each_other_still_do(case):
    _check_write(_DISJOINT_OR_SAME[case], 6)


_STRIDED_WRITES = {
    # a diagonal of a batch of matrices: strides that do not nest, but never meet
    "batched diagonal fill_": lambda x: x.view(2, 3, 3).diagonal(dim1=1, dim2=2).fill_(7.0),
    "as_strided add_": lambda x: x.as_strided((3, 2), (5, 3), 1).add_(1.0),
    # what torch.func.jacrev's basis builder does under vmap
    "vmap new_zeros diagonal fill_": lambda x: x.copy_(torch.func.vmap(
        lambda v: (lambda z: (z.diagonal().fill_(1.0), z)[1])(v.new_zeros(3, 3)))(x.view(2, 9)).reshape(-1)),
}


@pytest.mark.parametrize("case", sorted(_STRIDED_WRITES))
def test_writes_through_views_whose_elements_never_meet(case):
    """The overlap check took strides that do not nest for overlapping, so these raised."""
    _check_write(_STRIDED_WRITES[case], 18)


def test_vmap_of_jacrev_matches_cpu():
    x0 = torch.randn(4, 3)
    check_all_modes(lambda d: torch.func.vmap(torch.func.jacrev(torch.sin))(x0.to(d)))


def test_a_write_through_elements_that_meet_still_raises():
    x = torch.zeros(6).to("tpu")
    with pytest.raises(RuntimeError, match="single memory location"):
        x.as_strided((2, 3), (2, 1)).add_(1.0)  # element (0, 2) is element (1, 0)
    torch.testing.assert_close(x.cpu(), torch.zeros(6))


@pytest.mark.parametrize("write", [lambda a: a.__setitem__(0, 5.0), lambda a: a[:2].zero_(),
                                   lambda a: a.view(3)[1:].mul_(2)], ids=["setitem", "slice zero_", "view mul_"])
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_writing_through_a_view_of_an_inference_tensor_raises_like_cpu(write, mode):
    """Views of an inference tensor are inference tensors too; made outside inference_mode they
    passed for normal tensors, and the write went through."""
    def run(d):
        with torch.inference_mode():
            a = torch.ones(3).to(d)
        write(a)

    check_raises_like_cpu(run, mode)


def test_views_of_inference_tensors_read_and_write_inside_inference_mode():
    def run(d):
        with torch.inference_mode():
            a = torch.arange(6.0).to(d)
            a.view(2, 3)[:, 1].mul_(10)
        return [a, a.view(3, 2).T, a[1:].sum()]  # reads outside are fine

    check_all_modes(run)


def test_resizing_a_view_within_its_storage_keeps_it_a_view():
    """resize_ keeps the storage when it has room, as on CPU; fft_fftfreq relies on it (it fills
    a slice of its result through arange(out=), which resizes the empty slice it is given)."""
    def run(d):
        x = torch.zeros(6).to(d)
        v = x[2:2]
        v.resize_(3)
        v.fill_(1.0)
        return [x, torch.fft.fftfreq(5, device=d), torch.fft.fftfreq(4, 0.5, device=d)]

    check_all_modes(run)


def test_resize_as_grows_an_empty_tensor_and_resize_honours_memory_format():
    """resize_as_ carries the inplace_view tag, which sent it to the metadata-only route: an empty
    out tensor got the template's sizes but no storage, and the first write failed at the flush
    (`torch.lu(A, get_infos=True, out=...)` resizes its outputs with it). resize_ ignored
    memory_format."""
    def strides(t):
        return torch.tensor(t.stride())

    def run(d):
        src = torch.arange(120.0).view(2, 3, 4, 5)
        out = torch.empty(0).to(d)
        out.resize_as_(src.to(d)).copy_(src.to(d))
        kept = torch.empty(0).to(d)
        kept.resize_as_(src.to(d).to(memory_format=torch.channels_last), memory_format=torch.preserve_format)
        contig = torch.empty(0).to(d)
        contig.resize_as_(src.to(d).to(memory_format=torch.channels_last))
        cl = torch.zeros(2, 3, 4, 5).to(d)
        cl.resize_(2, 3, 4, 5, memory_format=torch.channels_last)
        same = torch.zeros(3, 4).to(d).t()
        same.resize_(4, 3)  # same sizes: strides kept
        a = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(d)
        lu = tuple(torch.empty(0, dtype=dt).to(d) for dt in (torch.float32, torch.int32, torch.int32))
        torch.lu(a, True, True, out=lu)
        return [out, strides(kept), strides(contig), strides(cl), strides(same), *lu]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.lu is deprecated
        check_all_modes(run)


@pytest.mark.parametrize("fmt", [torch.preserve_format, torch.channels_last])
@pytest.mark.parametrize("mode", MODES)
def test_resize_with_a_bad_memory_format_raises_like_cpu(fmt, mode):
    check_raises_like_cpu(lambda d: torch.empty(0).to(d).resize_(2, 3, memory_format=fmt), mode)


def _conv_bn_relu(d, channels_last="input"):
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 5, 6), torch.randn(4, 3, 3, 3)
    if channels_last == "input":
        x = x.to(memory_format=torch.channels_last)
    else:
        w = w.to(memory_format=torch.channels_last)
    x, w = x.to(d).requires_grad_(), w.to(d).requires_grad_()
    out = torch.nn.functional.conv2d(x, w, padding=1)
    act = torch.relu(torch.nn.functional.batch_norm(out, None, None, training=True))
    act.backward(torch.randn(act.shape).to(d))  # a contiguous gradient into channels_last outputs
    return out, act, x.grad, w.grad


@pytest.mark.parametrize("which", ["input", "weight"])
@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_a_channels_last_convolution_keeps_cpus_layout(mode, which):
    """CPU's convolution writes a channels_last output for a channels_last input or weight, and
    its backward channels_last gradients; the meta kernel said contiguous, so `.view` worked on
    tpu where CPU refuses it."""
    want = _conv_bn_relu("cpu", which)
    with deferfuse.mode(mode):
        got = _conv_bn_relu("tpu", which)
        torch.testing.assert_close([t.cpu() for t in got], list(want))
        assert [t.stride() for t in got] == [t.stride() for t in want]
        assert got[0].is_contiguous(memory_format=torch.channels_last)
    check_raises_like_cpu(lambda d: _conv_bn_relu(d)[0].view(2, -1), mode)
