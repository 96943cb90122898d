"""Why a flush ran: the causes `deferfuse.metrics()["flushes"]` counts and the report names.

A cause is a `str` as well, so metrics keys, JSON and user code that compares with "item" keep
working; deferfuse itself compares members, and asks the sets below rather than spelling causes.
"""
from __future__ import annotations

from enum import Enum


class Cause(str, Enum):
    # host reads: the sync points of DeferAndFuse
    ITEM = "item"
    BOOL = "bool"
    FLOAT = "float"
    INT = "int"
    TOLIST = "tolist"
    PRINT = "print"
    TO_CPU = "to_cpu"
    ASSERT = "assert"
    DATA_DEPENDENT = "data_dependent"  # an output shape set by values (nonzero, masked_select)
    CPU_FALLBACK = "cpu_fallback"  # an op without a lowering reads its inputs on the host
    SYNC = "sync"  # deferfuse.sync()
    SYNCHRONIZE = "synchronize"  # torch.tpu.synchronize()
    # the modes
    STRICT_OP = "strict_op"
    DEBUG_OP = "debug_op"
    MODE_EXIT = "mode_exit"
    MODE_CHANGE = "mode_change"
    CAPTURE = "capture"
    # torch.compile(backend="tpu"): a compiled graph recorded as one program on its first call,
    # and DeferAndFuse work still pending when a compiled graph is called
    COMPILED_GRAPH = "compiled_graph"
    COMPILE_MODE_EXECUTION = "compile_mode_execution"
    # a torch.distributed collective reads the values it sends (as TorchTPU's tpu_dist does)
    DISTRIBUTED_OP = "distributed_op"
    # DeferAndFuse's own cuts of a long recording
    REPEATED_OP = "repeated_op_heuristic"
    SIZE_CAP = "size_cap"
    OPTIMIZER_STEP = "optimizer_step"  # a training step ends where its optimizer's step() returns
    OPTIMIZER_STATE = "optimizer_state"  # the state an optimizer's first step creates, made apart

    __str__ = str.__str__
    __format__ = str.__format__


# Strict and Debug flush each top-level op on its own: a failure rolls back that op alone, and
# the many ops of one line are different programs, not recompiles of one.
ONE_OP = frozenset({Cause.STRICT_OP, Cause.DEBUG_OP})
# A flush that ends a recording context: the period detector starts over after it.
NEW_GRAPH = frozenset({Cause.MODE_EXIT, Cause.MODE_CHANGE, Cause.CAPTURE, Cause.COMPILED_GRAPH,
                       Cause.OPTIMIZER_STEP})
