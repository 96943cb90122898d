"""The differential fuzzer in the test suite: random straight-line programs (fuzz_gen, fuzz_ops)
run on CPU and on tpu in Strict, Debug and DeferAndFuse, compared by fuzz_run.

CI runs a fixed budget of seeds (about two minutes on two cores: programs share the small fixed
shape set, so most per-op programs are compiled once for the whole run). DEFERFUSE_FUZZ=<n> runs
n programs instead, DEFERFUSE_FUZZ_START=<k> from seed k; a long run is cheaper as a script:

    python tests/fuzz/fuzz_run.py --count 10000 --log fuzz.log

A failing seed's message is a shrunk program that reproduces it, runnable as it is printed.
"""
from __future__ import annotations

import os
import random

import pytest
import torch

import device_profile
from fuzz_gen import generate, inp
from fuzz_run import MODES, Failure, _py_close, check, check_seed, shrink

CI_SEEDS = 40
COUNT = int(os.environ.get("DEFERFUSE_FUZZ") or CI_SEEDS)
START = int(os.environ.get("DEFERFUSE_FUZZ_START") or 0)


def in_device_profile(item) -> bool:
    """The device profile's share (tests/device_profile.py): in its ci share a fixed quarter of
    the seeds, each about 13 s on a TPU v5e (its per-op programs compile there), and the
    fuzzer's own tests."""
    params = getattr(item, "callspec", None)
    return params is None or device_profile.in_share("fuzz seeds", params.params["seed"])


@pytest.mark.parametrize("seed", range(START, START + COUNT))
def test_random_program_agrees_with_cpu_in_every_mode(seed):
    report, _ = check_seed(seed)
    assert report is None, "\n" + report


def test_generation_is_deterministic_and_varied():
    """A seed names one program (a reproducer is its seed), and programs cover the families."""
    assert generate(7) == generate(7)
    text = "\n".join("\n".join(generate(s)) for s in range(30))
    for needle in ("_(", "[", ".item()", "del ", "@", ".sum(", "torch.bfloat16", "torch.complex64", "torch.bool",
                   "torch.int64", "(0,)", "()", ".t()", "as_strided", "# data-check"):
        assert needle in text, needle
    assert len({tuple(generate(s)) for s in range(20)}) == 20


def test_inputs_are_exact_small_values():
    for dt in (torch.float32, torch.bfloat16, torch.float64, torch.complex64):
        x = inp((4, 4), dt, random.randrange(1000))
        assert torch.equal(x.real * 2, (x.real * 2).round())


def test_a_disagreement_is_found_and_shrunk_to_its_statement(monkeypatch):
    """The harness itself: make tpu's `abs` wrong, and the reproducer keeps only what it needs."""
    stmts = ["a0 = inp((3,), torch.float32, 1).to(d)", "v1 = a0 * 2", "v2 = a0.abs()", "v3 = v1 + 1",
             "r4 = v3.sum().item()"]
    assert check(stmts, ("strict",)) == []
    real_abs = torch.Tensor.abs

    def wrong_abs(self):
        out = real_abs(self)
        return out + 1 if self.device.type == "tpu" else out

    monkeypatch.setattr(torch.Tensor, "abs", wrong_abs)
    failures = check(stmts, ("strict",))
    assert [f.where for f in failures] == ["v2"] and failures[0].kind == "value"
    assert shrink(stmts, failures[0]) == ["a0 = inp((3,), torch.float32, 1).to(d)", "v2 = a0.abs()"]
    assert isinstance(failures[0], Failure) and set(MODES) == {"strict", "debug", "defer_and_fuse"}


def test_host_reads_compare_like_tensors():
    nan, inf = float("nan"), float("inf")
    assert _py_close(complex(nan, nan), complex(nan, nan))  # seed 8801
    assert _py_close(complex(inf, nan), complex(nan, nan))
    assert not _py_close(complex(nan, nan), 1 + 2j)
    assert not _py_close(1 + 2j, 1 + 3j)
    assert _py_close(nan, nan) and not _py_close(nan, 1.0)
