"""torch.tpu as TorchTPU users spell it: the eager mode as a property and a block, device
properties, and memory queries (also through torch.accelerator) (issue 30, item 6)."""
from __future__ import annotations

import gc

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
            assert torch.tpu.eager_mode is deferfuse.EagerMode.STRICT  # the process-wide value
        assert deferfuse.modes.current().kind is deferfuse.EagerMode.STRICT
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
