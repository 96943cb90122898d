"""Which executor runs the next op: the innermost mode block's, else the process-wide default.

The state lives here, below the executors, rather than in modes.py, which only pushes and pops
the blocks and sets the default: a check made inside an op (data_checks' one_hot) must know the
mode in force, and modes imports the executors, so asking modes would close an import circle.
modes.py puts the default executor in DEFAULT at import, as the environment names it.
"""
from __future__ import annotations

from .base import Executor

# process-wide, not thread-local: modes.py says why. Lists, so that dispatch.py's hot path can
# hold them once and still see every push, pop and change of default.
STACK: list[Executor] = []  # open blocks' executors, the innermost last
DEFAULT: list[Executor] = []  # its one element: the executor outside any block


def current() -> Executor:
    return STACK[-1] if STACK else DEFAULT[0]
