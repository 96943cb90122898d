"""The in-memory compile cache empties itself before its executables exhaust the process's
memory mappings (deferfuse/cache/pressure.py): past vm.max_map_count, XLA segfaults."""
from __future__ import annotations

import pytest
import torch

import deferfuse
from deferfuse.cache import pressure


@pytest.fixture
def tight_limit(monkeypatch):
    """A mapping limit just above what the process holds now, checked at every miss."""
    now = pressure.mappings()
    monkeypatch.setattr(pressure, "_EVERY", 1)
    monkeypatch.setattr(deferfuse.cache, "_WARNED", False)  # the warning comes once per process
    monkeypatch.setattr(pressure, "_limit", lambda: int((now + 40) / pressure._FRACTION))


@pytest.mark.xla_cpu  # XLA:CPU maps each executable's machine code into the process
def test_each_executable_costs_mappings_that_a_reset_gives_back():
    before = pressure.mappings()
    with deferfuse.mode("strict"):
        for n in range(40):  # 40 distinct programs
            (torch.ones(n + 1, device="tpu") * 3).cpu()
    grown = pressure.mappings()
    assert grown > before + 40  # several mappings per loaded executable
    deferfuse.cache.clear()
    __import__("jax").clear_caches()
    assert pressure.mappings() < grown


@pytest.mark.xla_cpu  # the limit is met through XLA:CPU's mappings
def test_the_cache_empties_itself_near_the_limit_and_results_stay_right(tight_limit):
    deferfuse.reset_metrics()
    with pytest.warns(UserWarning, match="near the process's limit"):
        with deferfuse.mode("defer_and_fuse"):
            outs = [(torch.arange(n + 1.0, device="tpu") * 2 + 1).cpu() for n in range(60)]
    for n, out in enumerate(outs):
        torch.testing.assert_close(out, torch.arange(n + 1.0) * 2 + 1)
    m = deferfuse.metrics()
    assert m["cache_resets"] >= 1
    assert m["cache_entries"] < m["cache_misses"]  # programs compiled before the reset are no longer held


def test_no_reset_far_below_the_limit():
    deferfuse.reset_metrics()
    with deferfuse.mode("defer_and_fuse"):
        for n in range(10):
            (torch.ones(n + 2, device="tpu") + 1).cpu()
    assert deferfuse.metrics()["cache_resets"] == 0
