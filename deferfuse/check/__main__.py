"""`python -m deferfuse.check TARGET [--mode M] [--backward] [--threshold X] [--train] [--fallback-free]`

TARGET is `path/to/script.py` or `package.module`, optionally followed by `:function`. The
function (default `build`) takes no arguments and returns `model, inputs` or
`model, inputs, kwargs`, where `inputs` is one tensor or a tuple of positional arguments. A target
with no `build` and no `:function` is read from its globals `model`, `inputs` (and `kwargs`).
A script is run with `__name__` set to "__deferfuse_check__", so its `if __name__ == "__main__":`
block (a training loop, say) does not run.

Prints the table and exits 1 when a row fails (or, with --fallback-free, when an op fell back to
CPU), 0 otherwise: usable as a CI step.
"""
from __future__ import annotations

import argparse
import importlib
import os
import runpy
import sys
from typing import Any

from deferfuse.check import check


def load(target: str) -> tuple[Any, tuple, dict]:
    """The (model, inputs, kwargs) that TARGET names (see the module docstring)."""
    source, _, fn = target.rpartition(":") if ":" in target else (target, "", "")
    if source.endswith(".py") or os.sep in source:
        sys.path.insert(0, os.path.dirname(os.path.abspath(source)))  # as `python script.py` does
        found = runpy.run_path(source, run_name="__deferfuse_check__")
    else:
        found = vars(importlib.import_module(source))
    if fn or "build" in found:
        got = found[fn or "build"]()
    else:
        got = (found["model"], found["inputs"], found.get("kwargs"))
    model, inputs, kwargs = (*got, None) if len(got) == 2 else got
    return model, inputs if isinstance(inputs, tuple) else (inputs,), kwargs or {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deferfuse.check", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="script.py[:function] or package.module[:function]")
    parser.add_argument("--mode", default="defer_and_fuse", choices=["defer_and_fuse", "strict", "debug"])
    parser.add_argument("--backward", action="store_true", help="also compare every parameter's gradient")
    parser.add_argument("--threshold", type=float, default=0.10, help="relative MSE a row may reach (0.10)")
    parser.add_argument("--train", action="store_true", help="run in train mode (default: eval)")
    parser.add_argument("--fallback-free", action="store_true", help="fail when an op falls back to CPU")
    args = parser.parse_args(argv)
    model, inputs, kwargs = load(args.target)
    result = check(model, *inputs, mode=args.mode, backward=args.backward, threshold=args.threshold,
                   kwargs=kwargs, train=args.train)
    print(result)
    return 0 if result.ok and not (args.fallback_free and result.fallbacks) else 1


if __name__ == "__main__":
    sys.exit(main())
