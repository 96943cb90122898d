"""Lowerings from ATen to JAX, one family per file: each a small pure-JAX function registered for
an exact ATen overload (see registry.py for the decorator and what a lowering may declare).

Importing this package registers every lowering. Turning a lowering into a graph `Op` is the
recording layer's work (`lowered_op.py`).
"""
from __future__ import annotations

from .registry import LOWERINGS, LowerCtx, lowering, promotion_dtypes  # noqa: F401

# register every family
from . import attention, creation, elementwise, embedding_bag, factorizations, fft, foreach, indexing, linalg, linear, nn, optim, pooling, random, reduction, rnn, shape, sorting  # noqa: E402,F401
