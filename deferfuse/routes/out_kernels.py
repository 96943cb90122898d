"""out= overloads whose CPU composite kernel writes the result below the dispatcher.

`linalg_matrix_rank`'s out= kernel computes through dispatched ops and then stores into `out`
with a call that never reaches a Python-visible key, so on "tpu" `out` kept its old contents.
For each overload here deferfuse runs the functional overload (which decomposes normally) and
writes the result with PyTorch's out= rules (`transfers.assign_out`: resize with CPU's
deprecation warning, then a casting copy). Registered at AutogradPrivateUse1 because the composite kernel would
otherwise run there, before any backend key is reached.
"""
from __future__ import annotations

import torch

from ..tensor import TpuTensor
from ..transfers import assign_out

aten = torch.ops.aten

# out= overload name -> functional overload name, per op packet
_OUT_TO_FUNCTIONAL = {
    "linalg_matrix_rank": {
        "out": "default",
        "out_tol_tensor": "tol_tensor",
        "atol_rtol_tensor_out": "atol_rtol_tensor",
        "atol_rtol_float_out": "atol_rtol_float",
    },
}


def _writer(functional):
    def impl(*args, out, **kwargs):
        result = functional(*args, **kwargs)
        if not (isinstance(out, TpuTensor) and isinstance(result, TpuTensor)):
            raise RuntimeError(
                f"Expected out tensor to have device {result.device}, but got {out.device} instead"
            )
        assign_out(out, result)
        return out

    return impl


_lib = torch.library.Library("aten", "IMPL")
for _packet, _overloads in _OUT_TO_FUNCTIONAL.items():
    for _out_name, _fn_name in _overloads.items():
        _functional = getattr(getattr(aten, _packet), _fn_name)
        _qualified = _packet if _out_name == "default" else f"{_packet}.{_out_name}"
        _lib.impl(_qualified, _writer(_functional), "AutogradPrivateUse1")
