"""How a strided tensor view reads and writes the JAX array that backs its storage.

Storages hold one immutable jax.Array in a row-major "physical" shape; every tensor is a
(size, stride, storage_offset) view of it, exactly as in PyTorch. View ops therefore never compute
anything: they only create new metadata, and aliasing (an in-place op on a slice updates the base
and every other view) falls out of reading and writing through the same storage.

A read or write is compiled from a static *plan* chosen once per layout: the common views
(transpose, slice, select, expand, unsqueeze, reshape of contiguous data) become slices and
transposes that XLA fuses for free. A view whose strides nest but do not follow the physical dims
(a head split of a fused qkv projection: `qkv.split(c, -1)[1].view(b, t, h, d).transpose(1, 2)`)
reads the flat buffer reshaped so that each stride is a dim of its own, which is still a slice and
a transpose. Only exotic layouts (diagonal, overlapping as_strided) pay for a gather/scatter,
which is slow on every backend and slowest on TPUs. The storage offset is a runtime input, so a
view that moves through a buffer (a KV cache position, a loop over rows) reuses one compiled
program.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax.numpy as jnp
from jax import lax

Shape = tuple[int, ...]


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def is_contiguous(size: Sequence[int], stride: Sequence[int]) -> bool:
    expected = 1
    for n, s in zip(reversed(size), reversed(stride)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def dense_permutation(size: Sequence[int], stride: Sequence[int]) -> tuple[int, ...] | None:
    """The dim order that makes (size, stride) a contiguous layout, or None if it is not dense."""
    order = sorted(range(len(size)), key=lambda d: (-stride[d], d))
    if is_contiguous([size[d] for d in order], [stride[d] for d in order]):
        return tuple(order)
    return None


def partially_overlap(a: tuple, b: tuple) -> bool:
    """Whether two (size, stride, offset) views of one storage share some elements without being
    the same view: CPU PyTorch then refuses to write one from the other ("some elements of the
    input tensor and the written-to tensor refer to a single memory location"). Like CPU, it only
    judges views that are dense in some dim order; others it lets through."""
    (sa, ta, oa), (sb, tb, ob) = a, b
    na, nb = math.prod(sa), math.prod(sb)
    if na == 0 or nb == 0 or dense_permutation(sa, ta) is None or dense_permutation(sb, tb) is None:
        return False
    if oa == ob and na == nb:
        return ta != tb
    return oa < ob + nb and ob < oa + na


def _unravel(offset: int, phys: Shape, pstr: tuple[int, ...]) -> list[int]:
    out = []
    for n, s in zip(phys, pstr):
        out.append((offset // s) % n if n > 0 else 0)
    return out


def plan_view(phys: Shape, size: Shape, stride: tuple[int, ...], offset: int) -> tuple:
    """A hashable, offset-independent recipe for reading `size/stride` at `offset` from `phys`.

    The recipe is valid for this offset; callers key compiled programs on the recipe, so a
    different offset needing a different recipe compiles separately and never reuses a wrong one.
    """
    if any(n == 0 for n in size):
        return ("empty", phys, size)
    zero = offset == 0
    pstr = contiguous_strides(phys)
    keep = [(d, n, s) for d, (n, s) in enumerate(zip(size, stride)) if n != 1]
    bcast = tuple(d for d, n, s in keep if s == 0)
    real = [(d, n, s) for d, n, s in keep if s != 0]
    start = _unravel(offset, phys, pstr)
    used: dict[int, int] = {}
    mapping = []
    for d, n, s in real:
        j = next((j for j in range(len(phys)) if phys[j] > 1 and pstr[j] <= s and s % pstr[j] == 0), None)
        if j is None or j in used:
            break
        step = s // pstr[j]
        if start[j] + step * (n - 1) >= phys[j]:
            break
        used[j] = d
        mapping.append((d, j, step, n))
    else:
        return ("slice", phys, size, tuple(mapping), bcast, zero)
    order = sorted(real, key=lambda t: -t[2])
    contiguous = [t[0] for t in order] == [t[0] for t in real] and is_contiguous(
        [t[1] for t in real], [t[2] for t in real]
    )
    if not contiguous:
        nested = _plan_nested(math.prod(phys), order, offset)
        if nested is not None:
            return ("strided", phys, size, nested, bcast, zero)
    kind = "flat" if contiguous else "gather"
    return (kind, phys, size, tuple((d, n, s) for d, n, s in real), bcast, zero)


def _plan_nested(numel: int, order, offset: int):
    """Read the view as a slice of the flat buffer reshaped to one dim per stride, when its strides
    nest: sorted from the largest, each divides the one before and its run fits inside it.

    `order` is the view's non-unit, non-broadcast dims as (dim, size, stride), largest stride first.
    The reshaped buffer has dims (numel // s1, s1 // s2, ..., s_k); element (i1, ..., ik) of the
    view is at (i1, ..., ik, 0) past the offset's own coordinates, so the view is one slice there
    when those coordinates do not carry. The plan holds no offset: any offset that passes the same
    check reads through it, and one that does not gets another plan."""
    strides = [s for _, _, s in order]
    for (_, n, s), prev in zip(order[1:], strides):
        if prev % s or n * s > prev:
            return None
    rows = numel // strides[0]
    bshape = (rows,) + tuple(a // b for a, b in zip(strides, strides[1:])) + (strides[-1],)
    starts = _unravel(offset, bshape, strides + [1])
    if offset >= rows * strides[0] or any(st + n > b for st, (_, n, _), b in zip(starts, order, bshape)):
        return None
    return (bshape, tuple((d, n) for d, n, _ in order))


def _nested_flat(value, bshape):
    flat = value.reshape(-1)
    used = math.prod(bshape)
    if used != flat.shape[0]:
        flat = lax.slice(flat, [0], [used])
    return flat.reshape(bshape)


def _finish(x, plan_size: Shape, real_dims: list[int], bcast: tuple[int, ...]):
    """x holds the non-broadcast, non-unit view dims in `real_dims` order; build the full view."""
    shape = [1] * len(plan_size)
    for d in real_dims:
        shape[d] = plan_size[d]
    x = x.reshape(shape)
    if bcast:
        x = jnp.broadcast_to(x, plan_size)
    return x


def _index_type(phys: Shape):
    """The integer type a view's index arithmetic runs in: int32 wherever the storage's elements
    can be counted in it (all but >2³¹-element buffers). The offset arrives as a 64-bit runtime
    scalar, and a TPU has no 64-bit integer unit: XLA emulates the divisions and remainders that
    turn it into per-dim starts with thousands of 32-bit ops, which made a training step's
    program 4× larger and its compile 9× slower (docs/performance.md, the TPU section)."""
    return jnp.int32 if math.prod(phys) < 2**31 else jnp.int64


def _offset(offset, phys: Shape):
    """The runtime offset in the index type of `phys` (a Python int stays one)."""
    return offset if isinstance(offset, int) else offset.astype(_index_type(phys))


def _flat_indices(real, offset, itype):
    """offset + sum_d iota_d * stride_d, shaped like the real dims (computed on device)."""
    shape = tuple(n for _, n, _ in real)
    idx = None
    for k, (_, n, s) in enumerate(real):
        term = lax.broadcasted_iota(itype, shape, k) * s
        idx = term if idx is None else idx + term
    if idx is None:
        idx = jnp.zeros((), itype)
    return idx + offset


def read(value, plan: tuple, offset):
    kind, phys = plan[0], plan[1]
    if kind == "empty":
        return jnp.zeros(plan[2], value.dtype)
    _, _, size, mapping, bcast, zero = plan
    offset = _offset(offset, phys)
    if kind == "slice":
        pstr = contiguous_strides(phys)
        sizes = [1] * len(phys)
        steps = [1] * len(phys)
        for d, j, step, n in mapping:
            sizes[j] = (n - 1) * step + 1
            steps[j] = step
        if zero:
            x = lax.slice(value, [0] * len(phys), sizes)
        else:
            starts = [(offset // s) % n for n, s in zip(phys, pstr)]
            x = lax.dynamic_slice(value, starts, sizes)
        if any(st != 1 for st in steps):
            x = lax.slice(x, [0] * len(phys), x.shape, steps)
        by_phys = sorted(mapping, key=lambda m: m[1])
        x = x.reshape([m[3] for m in by_phys])
        dims_in_phys_order = [m[0] for m in by_phys]
        view_order = sorted(dims_in_phys_order)
        if dims_in_phys_order != view_order:
            x = jnp.transpose(x, [dims_in_phys_order.index(d) for d in view_order])
        return _finish(x, size, view_order, bcast)
    if kind == "strided":
        bshape, dims = mapping
        b = _nested_flat(value, bshape)
        sizes = [n for _, n in dims] + [1]
        x = lax.slice(b, [0] * len(bshape), sizes) if zero else lax.dynamic_slice(
            b, _unravel(offset, bshape, contiguous_strides(bshape)), sizes)
        x = x.reshape(sizes[:-1])
        in_order = [d for d, _ in dims]
        view_order = sorted(in_order)
        if in_order != view_order:
            x = jnp.transpose(x, [in_order.index(d) for d in view_order])
        return _finish(x, size, view_order, bcast)
    flat = value.reshape(-1)
    real = mapping
    numel = math.prod(n for _, n, _ in real)
    if kind == "flat":
        x = lax.slice(flat, [0], [numel]) if zero else lax.dynamic_slice(flat, [offset], [numel])
        x = x.reshape([n for _, n, _ in real])
    else:
        x = jnp.take(flat, _flat_indices(real, 0 if zero else offset, _index_type(phys)), mode="clip")
    return _finish(x, size, [d for d, _, _ in real], bcast)


def write(value, plan: tuple, offset, new):
    """Return `value` with the view described by `plan` replaced by `new` (logical view shape)."""
    kind, phys = plan[0], plan[1]
    if kind == "empty":
        return value
    _, _, size, mapping, bcast, zero = plan
    if bcast:
        # only a fill gets here (transfers.check_writable refuses other writes at the call): every
        # element along a broadcast dim is the same value, and one of them is written
        new = new[tuple(slice(0, 1) if d in bcast else slice(None) for d in range(len(size)))]
    new = new.astype(value.dtype)
    offset = _offset(offset, phys)
    if kind == "slice":
        pstr = contiguous_strides(phys)
        by_phys = sorted(mapping, key=lambda m: m[1])
        view_dims = sorted(m[0] for m in mapping)
        x = new.reshape([size[d] for d in view_dims])
        perm = [view_dims.index(m[0]) for m in by_phys]
        if perm != sorted(perm):
            x = jnp.transpose(x, perm)
        upd_shape = [1] * len(phys)
        for d, j, step, n in mapping:
            upd_shape[j] = n
        x = x.reshape(upd_shape)
        starts = [0] * len(phys) if zero else [(offset // s) % n for n, s in zip(phys, pstr)]
        if all(m[2] == 1 for m in mapping):
            return lax.dynamic_update_slice(value, x, starts)
        index = []
        for j, n in enumerate(upd_shape):
            step = next((m[2] for m in mapping if m[1] == j), 1)
            ix = starts[j] + step * jnp.arange(n, dtype=_index_type(phys))
            shape = [1] * len(phys)
            shape[j] = n
            index.append(ix.reshape(shape))
        return value.at[tuple(index)].set(x)
    if kind == "strided":
        bshape, dims = mapping
        in_order = [d for d, _ in dims]
        view_order = sorted(in_order)
        x = new.reshape([size[d] for d in view_order])
        if in_order != view_order:
            x = jnp.transpose(x, [view_order.index(d) for d in in_order])
        x = x.reshape([n for _, n in dims] + [1])
        starts = [0] * len(bshape) if zero else _unravel(offset, bshape, contiguous_strides(bshape))
        b = lax.dynamic_update_slice(_nested_flat(value, bshape), x, starts).reshape(-1)
        flat = value.reshape(-1)
        if b.shape[0] != flat.shape[0]:
            b = lax.concatenate([b, lax.slice(flat, [b.shape[0]], [flat.shape[0]])], 0)
        return b.reshape(phys)
    flat = value.reshape(-1)
    real = mapping
    x = new.reshape([n for _, n, _ in real]) if real else new.reshape(())
    if kind == "flat":
        flat = lax.dynamic_update_slice(flat, x.reshape(-1), [0 if zero else offset])
    else:
        flat = flat.at[_flat_indices(real, 0 if zero else offset, _index_type(phys))].set(x)
    return flat.reshape(phys)
