"""views.py against torch.as_strided: random views of random storages, read and written."""
from __future__ import annotations

import random

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import deferfuse  # noqa: F401  (x64)
from deferfuse import views


def _random_view(rng: random.Random):
    phys = [rng.randint(1, 6) for _ in range(rng.randint(1, 3))]
    v = torch.zeros(phys)
    for _ in range(rng.randint(0, 4)):
        op = rng.choice(["t", "slice", "select", "unsq", "expand", "diag", "flat", "perm", "split"])
        try:
            if op == "t" and v.dim() >= 2:
                v = v.transpose(0, v.dim() - 1)
            elif op == "slice" and v.dim() >= 1:
                d = rng.randrange(v.dim())
                n = v.shape[d]
                a = rng.randint(0, n - 1)
                b = rng.randint(a + 1, n)
                v = v.narrow(d, a, b - a)[(slice(None),) * d + (slice(None, None, rng.randint(1, 2)),)]
            elif op == "select" and v.dim() >= 1:
                d = rng.randrange(v.dim())
                v = v.select(d, rng.randrange(v.shape[d]))
            elif op == "unsq":
                v = v.unsqueeze(rng.randint(0, v.dim()))
            elif op == "expand" and v.dim() >= 1:
                shape = list(v.shape)
                ones = [i for i, n in enumerate(shape) if n == 1]
                if ones:
                    shape[rng.choice(ones)] = 3
                    v = v.expand(shape)
            elif op == "diag" and v.dim() >= 2:
                v = v.diagonal()
            elif op == "flat" and v.is_contiguous():
                v = v.reshape(-1)
            elif op == "perm" and v.dim() >= 2:
                v = v.permute(*reversed(range(v.dim())))
            elif op == "split" and v.dim() >= 1:
                d = rng.randrange(v.dim())
                if v.shape[d] % 2 == 0:
                    v = v.unflatten(d, (2, v.shape[d] // 2))
        except RuntimeError:
            pass
    return tuple(phys), tuple(v.shape), tuple(v.stride()), v.storage_offset()


def _overlapping(size, stride, offset):
    seen = set()
    for idx in np.ndindex(*size):
        k = offset + sum(i * s for i, s in zip(idx, stride))
        if k in seen:
            return True
        seen.add(k)
    return False


def _exact(values):
    """float64 values every device holds exactly: a TPU keeps a float64 as two float32s, about 48
    of its 53 bits (a TPU v5e moved random doubles by up to 9e-16), and these tests are about
    where values land, not about how many bits a device keeps."""
    return np.asarray(values, dtype=np.float32).astype(np.float64)


def _check_read_and_write(phys, size, stride, offset, seed=0):
    read = jax.jit(views.read, static_argnums=1)
    write = jax.jit(views.write, static_argnums=1)
    base = np.arange(int(np.prod(phys)), dtype=np.float64)
    plan = views.plan_view(phys, size, stride, offset)
    expected = torch.from_numpy(base.copy()).as_strided(size, stride, offset).numpy()
    np.testing.assert_array_equal(np.asarray(read(jnp.asarray(base.reshape(phys)), plan, offset)), expected,
                                  err_msg=str(plan))
    new = _exact(np.random.default_rng(seed).random(size))
    ref = torch.from_numpy(base.copy())
    ref.as_strided(size, stride, offset).copy_(torch.from_numpy(new))
    out = np.asarray(write(jnp.asarray(base.reshape(phys)), plan, offset, jnp.asarray(new)))
    np.testing.assert_array_equal(out.reshape(-1), ref.numpy(), err_msg=str(plan))
    return plan


@pytest.mark.parametrize("which", range(3))
def test_head_split_of_a_fused_projection_is_a_slice_not_a_gather(which):
    """q, k and v of `qkv.split(c, -1)` viewed as heads and transposed: strides that nest but
    cross the physical dims. A gather here cost the GPT step about a tenth of its program time."""
    b, t, h, d = 2, 5, 3, 4
    qkv = torch.zeros(b, t, 3 * h * d)
    v = qkv.split(h * d, -1)[which].view(b, t, h, d).transpose(1, 2)
    plan = _check_read_and_write((b, t, 3 * h * d), tuple(v.shape), v.stride(), v.storage_offset(), which)
    assert plan[0] == "strided"
    # a plan holds no offset: k and v share one (and one compiled program) when they share its check
    if which:
        assert plan == views.plan_view((b, t, 3 * h * d), tuple(v.shape), v.stride(), 2 * h * d)


def test_nested_view_past_the_last_whole_row():
    """The buffer's tail that no whole row covers stays as it was on a write."""
    phys = (7, 3)  # 21 elements; rows of stride 6 leave three over
    plan = _check_read_and_write(phys, (3, 2), (6, 2), 1)
    assert plan[0] == "strided"


@pytest.mark.parametrize("seed", range(4))
def test_random_views_read_and_write_like_torch(seed):
    rng = random.Random(seed)
    read = jax.jit(views.read, static_argnums=1)
    write = jax.jit(views.write, static_argnums=1)
    kinds = set()
    for _ in range(100):
        phys, size, stride, offset = _random_view(rng)
        base = np.arange(int(np.prod(phys)), dtype=np.float64)
        plan = views.plan_view(phys, size, stride, offset)
        kinds.add(plan[0])
        expected = torch.from_numpy(base.copy()).as_strided(size, stride, offset).numpy()
        got = np.asarray(read(jnp.asarray(base.reshape(phys)), plan, offset))
        np.testing.assert_array_equal(got, expected, err_msg=str(plan))
        if _overlapping(size, stride, offset):
            continue
        new = _exact(np.random.default_rng(seed).random(size))
        ref = torch.from_numpy(base.copy())
        ref.as_strided(size, stride, offset).copy_(torch.from_numpy(new))
        out = np.asarray(write(jnp.asarray(base.reshape(phys)), plan, offset, jnp.asarray(new)))
        np.testing.assert_array_equal(out.reshape(-1), ref.numpy(), err_msg=str(plan))
    assert "slice" in kinds


def test_plan_is_offset_independent_for_moving_windows():
    phys = (10, 4)
    plans = {views.plan_view(phys, (4,), (1,), 4 * r) for r in range(1, 10)}
    assert len(plans) == 1  # a row view at any row shares one plan (and one program)


def _int_ops(jaxpr) -> set:
    """(primitive, dtype) of every integer op in a jaxpr, sub-jaxprs included."""
    out = set()
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            if jnp.issubdtype(v.aval.dtype, jnp.integer):
                out.add((eqn.primitive.name, str(v.aval.dtype)))
        for sub in jax_core.jaxprs_in_params(eqn.params):
            out |= _int_ops(sub)
    return out


# a fused qkv projection split into heads ("strided"), a row of a matrix ("slice"), a flat run
# ("flat"), a diagonal ("gather"): every plan kind, read and written at a runtime offset
_VIEWS = [((2, 8, 48), (2, 4, 8, 4), (384, 4, 48, 1), 16), ((6, 5), (5,), (1,), 10), ((4, 6), (2, 6), (6, 1), 6),
          ((5, 5), (4,), (6,), 6)]


@pytest.mark.parametrize("phys,size,stride,offset", _VIEWS)
def test_a_runtime_offset_is_indexed_in_32_bits(phys, size, stride, offset):
    """The offset arrives as a 64-bit scalar; a TPU emulates 64-bit integer arithmetic with
    thousands of 32-bit ops (a GPT step's program compiled 9× slower for it), so the divisions
    that turn it into per-dim starts run in int32 wherever the storage fits, and give the same
    values as before."""
    plan = views.plan_view(phys, size, stride, offset)
    base = jnp.arange(int(np.prod(phys)), dtype=jnp.float32).reshape(phys)
    off = jnp.asarray(offset, jnp.int64)
    got = views.read(base, plan, off)
    expect = torch.arange(int(np.prod(phys)), dtype=torch.float32).as_strided(size, stride, offset)
    np.testing.assert_array_equal(np.asarray(got), expect.numpy())
    new = jnp.full(size, -1.0, jnp.float32)
    written = torch.arange(int(np.prod(phys)), dtype=torch.float32).reshape(phys)
    written.as_strided(size, stride, offset).fill_(-1.0)
    np.testing.assert_array_equal(np.asarray(views.write(base, plan, off, new)), written.numpy())
    for fn in (lambda b, o: views.read(b, plan, o), lambda b, o: views.write(b, plan, o, new)):
        ops = _int_ops(jax.make_jaxpr(fn)(base, off).jaxpr)
        wide = {(p, d) for p, d in ops if d == "int64" and p != "convert_element_type"}
        assert not wide, wide


def test_a_storage_past_32_bits_keeps_64_bit_offsets():
    """Past 2³¹ elements an int32 offset would wrap: such a storage keeps 64-bit arithmetic
    (traced abstractly here; nothing that large is allocated)."""
    phys = (2**31 + 8,)
    plan = views.plan_view(phys, (4,), (2,), 2**31)
    big = jax.ShapeDtypeStruct(phys, jnp.int8)
    ops = _int_ops(jax.make_jaxpr(lambda b, o: views.read(b, plan, o))(big, jnp.int64(2**31)).jaxpr)
    assert ("convert_element_type", "int32") not in ops
