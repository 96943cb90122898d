"""The public functions: sync, metrics, reset_metrics."""
from __future__ import annotations

from typing import Any

from .causes import Cause
from . import cache, compiler, pending, events, sources


def sync(cause: str = Cause.SYNC, depth: int = 2) -> None:
    """Run everything pending now and wait for it (`deferfuse.sync()`, `torch.tpu.synchronize()`)."""
    where = sources.user_frame(depth)
    done = pending.flush(cause, where)
    pending.block(done, everything=True)


def metrics() -> dict[str, Any]:
    """Counters since start (or the last `reset_metrics()`): ops recorded, flushes by cause, cache hits
    and misses (= programs compiled), compile seconds, execute calls, CPU fallbacks by op name,
    decomposed ops replayed as one node by op name, and how many intermediates were never
    materialised."""
    out = events.METRICS.as_dict()
    out["pending_nodes"] = pending.pending_count()
    out["cache_entries"] = cache.size()
    out["graph_breaks"] = compiler.graph_breaks()  # torch.compile's, as Dynamo counts them
    return out


def reset_metrics() -> None:
    events.reset()
    compiler.reset_graph_breaks()
