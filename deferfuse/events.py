"""Counters and structured events: the raw material of `deferfuse.metrics()` and the report.

Everything the engine wants to tell a user is recorded here first as plain data (a flush with
its cause and source line, a compile with its key diff, a CPU fallback), and only rendered to text
by the report or the live log. Recording a counter is a dict increment; the per-flush event list
is bounded so a long run does not grow without limit.
"""
from __future__ import annotations

import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from .config import CONFIG
from .sources import fmt


@dataclass
class Metrics:
    ops_recorded: int = 0
    # top-level ops served from the trace of an earlier step (executors/replay.py), not recorded
    ops_replayed: int = 0
    flushes: Counter = field(default_factory=Counter)  # cause -> count
    cache_hits: int = 0
    cache_misses: int = 0
    # jitted programs created: a missed plan's programs minus the groups it shares with others
    programs_built: int = 0
    compile_seconds: float = 0.0
    # XLA's own share of it: the backend compiles (JAX's monitoring event), none for a program
    # loaded from the persistent cache, whose tracing and lowering compile_seconds still counts
    xla_compile_seconds: float = 0.0
    # and how many: one per program deferfuse compiled, unless JAX compiled one again unseen
    xla_compiles: int = 0
    execute_calls: int = 0
    # of those, programs of a replayed step launched before its flush (cache/ahead.py), and ones
    # launched whose flush then ran another plan, so that they were run again
    programs_ran_ahead: int = 0
    programs_ran_ahead_wasted: int = 0
    # flushes of zeros and ones alone, made on the host and copied over: no program (cache/fills.py)
    fills_on_host: int = 0
    cpu_fallbacks: Counter = field(default_factory=Counter)  # op name -> count
    # op name -> calls recorded as one node from the kept expansion of their decomposition
    decompositions_replayed: Counter = field(default_factory=Counter)
    outputs_materialized: int = 0
    bytes_materialized: int = 0
    intermediates_skipped: int = 0
    bytes_skipped: int = 0
    nodes_flushed: int = 0
    # inputs whose buffers a program reused for its outputs (in-place updates, dead temporaries)
    buffers_donated: int = 0
    bytes_donated: int = 0
    sync_wait_seconds: float = 0.0
    flush_seconds: float = 0.0
    execute_seconds: float = 0.0  # host time dispatching programs (device work is asynchronous)
    record_seconds: float = 0.0  # time inside deferfuse's dispatcher outside flushes (report on only)
    max_pending: int = 0
    host_syncs: Counter = field(default_factory=Counter)  # cause -> reads to the host (flushing or not)
    # XLA compiles that asked the persistent (on-disk) cache, and how many it answered
    persistent_lookups: int = 0
    persistent_hits: int = 0
    # of those hits, programs deferfuse's own store served without tracing them (cache/stored.py)
    programs_loaded: int = 0
    # torch.compile(backend="tpu"): graphs handed to the backend, and calls of compiled graphs
    compiled_graphs: int = 0
    compiled_calls: int = 0
    # in-memory compile cache emptied because its executables neared the mapping limit
    cache_resets: int = 0
    # torch.distributed on tpu tensors: collectives run, by name
    collectives: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ops_recorded": self.ops_recorded,
            "ops_replayed": self.ops_replayed,
            "flushes": sum(self.flushes.values()),
            "flushes_by_cause": {str(c): n for c, n in self.flushes.items()},
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "programs_compiled": self.cache_misses,
            "programs_built": self.programs_built,
            "compile_seconds": self.compile_seconds,
            "xla_compile_seconds": self.xla_compile_seconds,
            "xla_compiles": self.xla_compiles,
            "execute_calls": self.execute_calls,
            "programs_ran_ahead": self.programs_ran_ahead,
            "programs_ran_ahead_wasted": self.programs_ran_ahead_wasted,
            "fills_on_host": self.fills_on_host,
            "cpu_fallbacks": dict(self.cpu_fallbacks),
            "cpu_fallbacks_total": sum(self.cpu_fallbacks.values()),
            "decompositions_replayed": dict(self.decompositions_replayed),
            "outputs_materialized": self.outputs_materialized,
            "bytes_materialized": self.bytes_materialized,
            "intermediates_skipped": self.intermediates_skipped,
            "bytes_skipped": self.bytes_skipped,
            "nodes_flushed": self.nodes_flushed,
            "buffers_donated": self.buffers_donated,
            "bytes_donated": self.bytes_donated,
            "sync_wait_seconds": self.sync_wait_seconds,
            "flush_seconds": self.flush_seconds,
            "execute_seconds": self.execute_seconds,
            "record_seconds": self.record_seconds,
            "max_pending": self.max_pending,
            "host_syncs_by_cause": {str(c): n for c, n in self.host_syncs.items()},
            "collectives": dict(self.collectives),
            "cache_resets": self.cache_resets,
            "persistent_cache_hits": self.persistent_hits,
            "persistent_cache_misses": self.persistent_lookups - self.persistent_hits,
            "programs_loaded": self.programs_loaded,
            "compiled_graphs": self.compiled_graphs,
            "compiled_calls": self.compiled_calls,
        }


METRICS = Metrics()

# Structured events for the report. Off unless a report is being collected, so a plain run pays
# nothing beyond the counters above.
_EVENTS: deque | None = None
_EVENT_CAP = 200_000


def collecting() -> bool:
    return _EVENTS is not None


# Whether per-op timing is on (the report asked for it). Read by the dispatcher once per top-level
# op, so a plain run pays one global lookup.
TIMING = [False]


def start_collecting() -> None:
    """Keep structured events (and time recording per op) until `stop_collecting()`."""
    global _EVENTS
    _EVENTS = deque(maxlen=_EVENT_CAP)
    TIMING[0] = True


def stop_collecting() -> list[dict]:
    global _EVENTS
    out = list(_EVENTS or ())
    _EVENTS = None
    TIMING[0] = False
    return out


def events() -> list[dict]:
    return list(_EVENTS or ())


def emit(kind: str, **data: Any) -> None:
    if _EVENTS is not None:
        data["kind"] = kind
        data["t"] = time.perf_counter()
        _EVENTS.append(data)
    if kind in CONFIG.log or ("all" in CONFIG.log and kind in ("flush", "compile", "fallback")):
        _log_line(kind, data)


def _log_line(kind: str, data: dict) -> None:
    if kind == "flush":
        msg = (
            f"[deferfuse] flush: cause={data['cause']} at {fmt(data.get('where'))} "
            f"nodes={data['nodes']} outputs={data['outputs']} cache={'hit' if data['hit'] else 'miss'}"
        )
    elif kind == "compile":
        msg = (
            f"[deferfuse] compile: {data['ops']} ops in {data['seconds'] * 1e3:.0f} ms "
            f"at {fmt(data.get('where'))}; {data.get('why', 'first compile')}"
        )
    elif kind == "fallback":
        msg = f"[deferfuse] fallback: {data['op']} ran on CPU at {fmt(data.get('where'))}"
    else:
        msg = f"[deferfuse] {kind}: {data}"
    print(msg, file=sys.stderr)


def reset() -> None:
    global METRICS
    fresh = Metrics()
    for name in fresh.__dataclass_fields__:
        setattr(METRICS, name, getattr(fresh, name))
    if _EVENTS is not None:
        _EVENTS.clear()
