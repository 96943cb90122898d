"""The interface the three executors share: hooks around each ATen call.

An executor does not run ops itself (the engine records and the cache runs); it decides *when*
the pending graph is flushed and what is checked around it:

- `before_op(func, args, kwargs)`: called for each top-level op before it is recorded.
- `after_op(func, out)`: called when a top-level op has returned `out`.
- `on_exit()`: called when a `with deferfuse.mode(...)` block of this kind ends.
- `before_optimizer_step()` / `after_optimizer_step()`: called when any
  `torch.optim.Optimizer.step()` begins / returns.
"""
from __future__ import annotations

from enum import Enum


class EagerMode(str, Enum):
    """The three eager modes, with TorchTPU's names as aliases."""

    DEFER_AND_FUSE = "defer_and_fuse"
    STRICT = "strict"
    DEBUG = "debug"
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"


class Executor:
    kind: EagerMode
    checks_before = False  # whether before_op does anything (saves a call on the hot path)
    runs_eagerly = False  # whether a top-level op may run straight from the cache (Strict)
    # When set, the router calls serve(func, args, kwargs, route) for a top-level op instead of
    # the route and `after_op`: DeferAndFuse's step replay (replay.py)
    serve = None

    def before_op(self, func, args, kwargs) -> None:
        pass

    def after_op(self, func, out) -> None:
        pass

    def on_exit(self) -> None:
        pass

    def before_optimizer_step(self) -> None:
        pass

    def after_optimizer_step(self) -> None:
        pass

    def __repr__(self):
        return f"<{type(self).__name__} {self.kind.value}>"
