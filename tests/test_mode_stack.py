"""`deferfuse.mode()` is a TorchDispatchMode on PyTorch's mode stack: tools that read the stack see
it, and user modes inside or outside it see ops in PyTorch's usual order (the innermost first)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import (TorchDispatchMode, _get_current_dispatch_mode_stack,
                                          is_in_torch_dispatch_mode)

import deferfuse
from conftest import MODES


class _Log(TorchDispatchMode):
    """Notes each op it sees and the devices of its tensor arguments, then runs it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        self.seen.append((func, frozenset(devices)))
        return func(*args, **(kwargs or {}))


def _program(d):
    x = torch.arange(6.0).to(d).reshape(2, 3)
    return ((x * 2).exp() - x.sum(0)).softmax(-1)


@pytest.mark.parametrize("mode", MODES)
def test_the_block_is_a_dispatch_mode_on_pytorchs_stack(mode):
    m = deferfuse.mode(mode)
    assert isinstance(m, TorchDispatchMode)
    assert m not in _get_current_dispatch_mode_stack()
    with m:
        assert _get_current_dispatch_mode_stack()[-1] is m and is_in_torch_dispatch_mode()
        got = _program("tpu").cpu()
    assert m not in _get_current_dispatch_mode_stack()
    torch.testing.assert_close(got, _program("cpu"))


def test_an_exception_in_the_block_takes_the_mode_off_the_stack():
    before = list(_get_current_dispatch_mode_stack())
    with pytest.raises(ZeroDivisionError):
        with deferfuse.mode():
            torch.ones(2, device="tpu") + 1
            1 / 0
    assert _get_current_dispatch_mode_stack() == before


@pytest.mark.parametrize("mode", MODES)
def test_a_user_mode_inside_the_block_sees_the_tpu_ops_first(mode):
    log = _Log()
    with deferfuse.mode(mode):
        with log:
            got = _program("tpu")
        got = got.cpu()
    torch.testing.assert_close(got, _program("cpu"))
    ops = [f for f, devices in log.seen if devices == {"tpu"}]
    assert torch.ops.aten.exp.default in ops and torch.ops.aten._softmax.default in ops


@pytest.mark.parametrize("mode", MODES)
def test_a_user_mode_outside_the_block_sees_its_cpu_ops(mode):
    """deferfuse serves tpu ops itself (as any mode that implements an op does); CPU ops in the
    block go on down the stack, so the outer mode sees them as it would without the block."""
    log = _Log()
    with log:
        with deferfuse.mode(mode):
            a = torch.ones(3) * 4
            t = (torch.ones(3, device="tpu") * 4).cpu()
    torch.testing.assert_close(t, a)
    cpu_ops = [f for f, devices in log.seen if devices == {"cpu"}]
    assert torch.ops.aten.mul.Tensor in cpu_ops
    assert not any("tpu" in devices for _, devices in log.seen)


def test_nested_blocks_stack_and_unstack_in_order():
    outer, inner = deferfuse.mode(), deferfuse.mode("strict")
    with outer:
        with inner:
            assert _get_current_dispatch_mode_stack()[-2:] == [outer, inner]
            assert deferfuse.metrics() is not None and (torch.ones(2, device="tpu") + 1).sum().item() == 4
        assert _get_current_dispatch_mode_stack()[-1] is outer
    assert outer not in _get_current_dispatch_mode_stack()
