"""Every dtype survives the trip to tpu and back; 64-bit types are not narrowed."""
from __future__ import annotations

import pytest
import torch

import deferfuse
from deferfuse import device_dtypes, target


# --- dtypes -------------------------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_round_trip(dtype):
    if dtype == torch.bool:
        x = torch.tensor([True, False, True])
    elif dtype.is_complex:
        x = torch.tensor([1 + 2j, -3.5j, 7.25], dtype=dtype)
    elif dtype.is_floating_point:
        x = torch.tensor([1.5, -2.25, 3e5, 1e-3], dtype=dtype)
    else:
        info = torch.iinfo(dtype)
        x = torch.tensor([info.min, 0, 1, info.max], dtype=dtype)
    t = x.to("tpu")
    assert t.dtype == dtype and t.device.type == "tpu"
    back = t.cpu()
    assert back.dtype == dtype
    if dtype in device_dtypes.EMULATED.get(target.platform(), {}):
        # XLA:TPU holds a float64 as two float32s (deferfuse/device_dtypes.py): 48 bits of mantissa,
        # not 53, so 1e-3 comes back within 2**-48 of itself, not equal; float32 would lose 2**-24
        torch.testing.assert_close(back, x, rtol=2**-46, atol=0)
        torch.testing.assert_close(torch.tensor(t.tolist(), dtype=dtype), x, rtol=2**-46, atol=0)
    else:
        assert torch.equal(back, x)
        assert t.tolist() == x.tolist()
    with deferfuse.mode():
        y = (t + t) if dtype != torch.bool else (t | t)
        torch.testing.assert_close(y.cpu(), (x + x) if dtype != torch.bool else (x | x))


def test_int64_and_float64_are_not_downcast():
    big = torch.tensor([2**40 + 1, -(2**50)], dtype=torch.int64)
    precise = torch.tensor([1 / 3], dtype=torch.float64)
    with deferfuse.mode():
        assert torch.equal((big.to("tpu") * 2).cpu(), big * 2)
        assert (precise.to("tpu") * 3).cpu().item() == (precise * 3).item()
