"""An exception raised during a tpu backward pass is raised by backward(), as on CPU.

PyTorch's autograd engine aborted the process instead (std::terminate, no message) when a Python
exception crossed into it on a tpu backward: see deferfuse/backward.py. The cases run in a
subprocess (backward_error_cases.py), so that a regression fails these tests rather than killing
the test session.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import MODES

pytestmark = pytest.mark.subprocess  # the cases run in a process of their own

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["tensor_hook", "post_accumulate_hook", "module_hook", "module_pre_hook", "module_hook_wrong_count",
         "function_node_hook", "multi_grad_hook", "autograd_grad", "tpu_op_in_hook", "keyboard_interrupt",
         "second_order", "saved_tensors_unpack_hook", "checkpoint_recompute_fails"]


@pytest.fixture(scope="module")
def outcomes():
    p = subprocess.run([sys.executable, os.path.join(HERE, "backward_error_cases.py"), *MODES],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"the cases' process died (rc {p.returncode}): {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_exception_in_backward_is_raised_as_on_cpu(outcomes, case):
    """The same exception type and message as CPU, and the same gradients left behind."""
    got = outcomes[case]
    cpu = got["cpu"]
    assert cpu["raised"] is not None, "the case must raise on CPU"
    for mode in MODES:
        assert got[mode] == cpu, mode


def test_failing_op_in_a_backward_formula_stops_the_pass(outcomes):
    """A tpu op that a C++ backward formula calls raises: backward() raises its error, no
    gradient of that pass is written, and the next backward pass works."""
    for mode in MODES:
        got = outcomes["failing_backward_formula"][mode]
        assert got == {"raised": "simulated failure", "left": [True, True],
                       "after": [[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]}, mode
