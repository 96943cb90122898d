"""torch.compile(model, backend="tpu"): the third step after Strict and DeferAndFuse.

Dynamo traces tpu tensors as plain device tensors (dynamo.py), AOTAutograd turns the traced
function into ATen forward/backward graphs, and each graph is lowered by running it through
deferfuse's own recording path into one program of the shared compile cache, then replayed
without Python per op (graphs.py). With no `backend=` (Inductor), graphs with tpu inputs go to
"tpu" (backend.py).

`import deferfuse` does not import torch._dynamo (a second of import time): `torch.compile` is
wrapped so that its first call registers the backend, and the `torch_dynamo_backends` entry point
(`deferfuse.compiler.entry`) covers a lookup by name alone.
"""
from __future__ import annotations

import functools
import sys

import torch

_compile = torch.compile


def register() -> None:
    """Teach Dynamo about tpu tensors and register backend="tpu" (idempotent)."""
    # a local import on purpose: torch._dynamo costs a second to import, paid on first use only
    from . import backend

    backend.register()


@functools.wraps(_compile)
def compile(*args, **kwargs):
    register()
    return _compile(*args, **kwargs)


_breaks_at_reset = [0]


def graph_breaks() -> int:
    """Dynamo's graph breaks since the last `deferfuse.reset_metrics()` (0 before Dynamo loads)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else sum(utils.counters["graph_break"].values()) - _breaks_at_reset[0]


def reset_graph_breaks() -> None:
    _breaks_at_reset[0] += graph_breaks()


def install() -> None:
    """At `import deferfuse`: wrap torch.compile; register now if Dynamo is already loaded."""
    if torch.compile is _compile:
        torch.compile = compile
    if "torch._dynamo" in sys.modules:
        register()
