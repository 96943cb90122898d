"""torch.tpu as TorchTPU users spell it: the eager mode as a property and a block, device
properties, and memory queries (also through torch.accelerator) (issue 30, item 6)."""
from __future__ import annotations

import gc
import warnings

import pytest
import torch

import deferfuse


def test_eager_mode_is_a_settable_property_and_set_eager_mode_a_block():
    before = torch.tpu.eager_mode
    assert before is deferfuse.get_default_mode()
    try:
        torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE
        assert deferfuse.get_default_mode() is deferfuse.EagerMode.DEFER_AND_FUSE
        torch.tpu.eager_mode = "strict"
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
            assert deferfuse.modes.current().kind is deferfuse.EagerMode.DEBUG
            assert torch.tpu.eager_mode is deferfuse.EagerMode.DEBUG  # the mode in force
        assert deferfuse.modes.current().kind is deferfuse.EagerMode.STRICT
        assert torch.tpu.eager_mode is deferfuse.EagerMode.STRICT
    finally:
        torch.tpu.eager_mode = before


@pytest.mark.parametrize("block", [torch.tpu.set_eager_mode, deferfuse.mode], ids=["set_eager_mode", "mode"])
def test_eager_mode_reads_the_mode_in_force_inside_blocks(block):
    """Read inside a block, the property says what the ops there do: DeferAndFuse while they
    are being deferred, not the process-wide Strict outside (issue 40, item 5)."""
    before = deferfuse.get_default_mode()
    deferfuse.set_default_mode("strict")
    try:
        assert torch.tpu.eager_mode is deferfuse.EagerMode.STRICT
        with block(torch.tpu.EagerMode.DEFER_AND_FUSE):
            y = torch.ones(3, device="tpu") * 2
            assert deferfuse.pending.PENDING.graph.nodes  # deferred, not run
            assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_AND_FUSE
            with block("debug"):
                assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
            assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_AND_FUSE
        assert torch.tpu.eager_mode is deferfuse.EagerMode.STRICT
        assert y.tolist() == [2.0, 2.0, 2.0]
    finally:
        deferfuse.set_default_mode(before)


def test_assigning_eager_mode_inside_a_block_sets_the_process_wide_mode_and_warns():
    """TorchTPU's property is the process-wide value and its block is checked first: assigned
    inside a block, the new mode applies once the block ends. A read right after the assignment
    then gives the block's mode, not the one assigned, so the assignment says so."""
    before = torch.tpu.eager_mode
    try:
        with torch.tpu.set_eager_mode("defer_and_fuse"):
            with pytest.warns(UserWarning, match="stays in force until the block ends"):
                torch.tpu.eager_mode = "debug"
            assert torch.tpu.eager_mode is deferfuse.EagerMode.DEFER_AND_FUSE
            assert deferfuse.get_default_mode() is deferfuse.EagerMode.DEBUG
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                torch.tpu.eager_mode = "defer_and_fuse"  # the block's own mode: nothing to say
        assert torch.tpu.eager_mode is deferfuse.EagerMode.DEFER_AND_FUSE
    finally:
        torch.tpu.eager_mode = before


def test_device_properties_name_the_jax_device():
    props = torch.tpu.get_device_properties()
    assert props.name == torch.tpu.get_device_name() and props.type in ("cpu", "gpu", "tpu")
    with pytest.raises(AssertionError):
        torch.tpu.get_device_properties(1)


@pytest.mark.parametrize("api", ["tpu", "accelerator"])
def test_memory_allocated_follows_live_tensors(api):
    module = torch.tpu if api == "tpu" else torch.accelerator
    gc.collect()  # earlier tests' garbage would otherwise be freed during this one
    # the program that makes x, compiled and loaded first: a TPU holds executables in its memory
    # too (a TPU v5e counted 49 KiB more for the first x than the tensor's 1 MiB)
    torch.ones(1 << 18, device="tpu")
    deferfuse.sync()
    base = module.memory_allocated()
    module.reset_peak_memory_stats()
    x = torch.ones(1 << 18, device="tpu")  # 1 MiB
    deferfuse.sync()
    assert module.memory_allocated() - base == 1 << 20
    del x
    assert module.memory_allocated() == base
    assert module.max_memory_allocated() >= base + (1 << 20)
    assert module.memory_stats()["allocated_bytes.all.current"] == base
    module.empty_cache()
