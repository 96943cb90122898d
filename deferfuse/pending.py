"""The pending graph: ops are recorded into it, and a flush runs it through the compile cache.

All three modes go through here. Strict and Debug flush after every top-level op, DeferAndFuse at
sync points; so a Strict op and a one-op DeferAndFuse group are the same cache entry.
"""
from __future__ import annotations

import gc
import time
import weakref

import jax
import jax.numpy as jnp
from torch._C._dynamo.eval_frame import set_eval_frame

from . import cache, events, interrupts, sources, target, views
from .causes import NEW_GRAPH, ONE_OP
from .config import CONFIG
from .dtypes import to_jax_dtype
from .events import METRICS
from .graph import OUT_BITS, Graph, Op, PeriodDetector
from .target import jax_device
from .tensor import LAYOUTS, Storage, TpuTensor


class FlushError(RuntimeError):
    """A flush failed; names the ops and the user's source lines involved."""


class Pending:
    def __init__(self):
        self.graph = Graph()
        self.period = PeriodDetector(CONFIG.period_lookback)
        self.flushing = False
        self.where = None  # the user's (code, offset) of the top-level op being recorded
        self.pushed = 0  # nodes of the current graph already seen by the period detector
        self.captured = None  # the last captured flush (see capture.py)
        # where an optimizer's step() ended, while DeferAndFuse owes a cut before the next op
        self.cut_due = None
        # called as a flush of recorded nodes begins, before it decides which values are live
        # (the step replay lets go of the storages it holds: executors/replay.py)
        self.before_flush: list = []
        self.garbage = False  # Dynamo compiled a frame since the last flush (compiler/backend.py)


PENDING = Pending()
interrupts.when_busy(lambda: PENDING.flushing)
_SOURCE_LINES = CONFIG.source_lines
_user_frame = sources.user_frame


def where():
    """The user's location for a recorded node: that of the top-level op being recorded."""
    return PENDING.where


# --- internal ops: view reads/writes and uninitialised memory ------------------------------


def read_op(lay, lid) -> tuple[Op, tuple | None]:
    """A view's read from its storage's value, and the read's scalars (`tensor_ref`, record.run_now)."""
    (plan, off), (shape, _, dtype) = lay, LAYOUTS[lid]
    zero = plan[0] == "empty" or plan[-1]

    def make():
        def fn(ins, scs):
            return [views.read(ins[0], plan, 0 if zero else scs[0])]

        jd = to_jax_dtype(dtype)
        return Op(("read", plan, dtype), "view_read", fn, [(shape, jd)], 0 if zero else 1, family="view")

    return Op.intern(("read", plan, dtype), make), None if zero else (off,)


def _write_op(plan, phys, dtype) -> Op:
    zero = plan[0] == "empty" or plan[-1]
    jd = to_jax_dtype(dtype)

    def make():
        def fn(ins, scs):
            return [views.write(ins[0], plan, 0 if zero else scs[0], ins[1])]

        return Op(("write", plan, dtype), "view_write", fn, [(phys, jd)], 0 if zero else 1, family="view")

    return Op.intern(("write", plan, dtype), make)


def _zeros_op(shape, dtype) -> Op:
    jd = to_jax_dtype(dtype)

    def make():
        return Op(("zeros", shape, dtype), "empty", lambda ins, scs: [jnp.zeros(shape, jd)], [(shape, jd)], 0,
                  family="creation")

    return Op.intern(("zeros", shape, dtype), make)


# --- recording -------------------------------------------------------------------------------


def value_ref(g: Graph, st: Storage) -> int:
    """The graph ref of a storage's current value (registering a concrete one as an input)."""
    if st.graph is g:
        return st.ref
    v = st.value
    if v is not None:
        if g.sources is not None:
            return _captured_input(g, v, st)
        return g.input_ref(v, st.shape, st.dtype)
    if st.error is not None:
        raise st.error
    if st.graph is not None:
        raise RuntimeError("deferfuse internal error: a storage holds a value of a finished graph")
    ref = g.add(_zeros_op(st.shape, st.dtype), (), None, None)
    st.set_pending(g, ref)
    return ref


def _captured_input(g: Graph, v, st: Storage) -> int:
    n = len(g.inputs)
    ref = g.input_ref(v, st.shape, st.dtype)
    if len(g.inputs) > n:
        g.sources.append(weakref.ref(st))
    return ref


def tensor_ref(g: Graph, t: TpuTensor) -> int:
    st = t._st
    r = st.ref if st.graph is g else value_ref(g, st)
    lay = t._lay
    if lay is None:
        return r
    key = (r, *lay)  # (ref, plan, offset)
    hit = g.reads.get(key)
    if hit is None:
        op, scalars = read_op(lay, t._lid)
        hit = g.add(op, (r,), scalars, where())
        g.reads[key] = hit
    return hit


def record(op: Op, tensors, scalars) -> tuple[Graph, int]:
    """Append one node reading `tensors`; returns (graph, base ref of its outputs)."""
    g = PENDING.graph
    refs = []
    for t in tensors:  # tensor_ref, its two common cases inline: a whole tensor pending here, or
        st = t._st  # one whose concrete value is already an input (a weight read again)
        if t._lay is None:
            if st.graph is g:
                refs.append(st.ref)
                continue
            pos = g.input_pos.get(id(st.value))
            if pos is not None and g.sources is None:
                refs.append(-(pos + 1))
                continue
        refs.append(tensor_ref(g, t))
    base = g.add(op, tuple(refs), scalars, PENDING.where)
    METRICS.ops_recorded += 1
    return g, base


def write(t: TpuTensor, new_ref: int, g: Graph) -> None:
    """Make `new_ref` (t's logical shape and dtype, already cast) the contents of view t."""
    st = t._st
    if t._lay is None:
        st.set_pending(g, new_ref)
        return
    plan, off = t._lay
    if plan[0] == "empty":
        return
    old = value_ref(g, st)
    op = _write_op(plan, st.shape, st.dtype)
    ref = g.add(op, (old, new_ref), None if op.n_scalars == 0 else (off,), where())
    st.set_pending(g, ref)


def write_concrete(t: TpuTensor, array) -> None:
    """Make a concrete logical array the contents of view t (host-to-device copies)."""
    if t._lay is None:
        t._st.set_value(array)  # whole replacement: whatever was pending for it is now dead
        return
    g = PENDING.graph
    write(t, g.input_ref(array, tuple(array.shape), t.dtype), g)


# --- flushing ----------------------------------------------------------------------------------


def release(t: TpuTensor) -> None:
    """Drop t's storage's value (FSDP2's free of a gathered parameter): it reads as zeros until
    written, as freshly allocated memory; what is pending for it is no longer computed for it."""
    st = t._st
    st.value = None
    st.graph = None
    st.error = None


def pending_count() -> int:
    return len(PENDING.graph.nodes)


def flush(cause: str, where=None) -> list:
    """Run everything pending. Returns the storages that received values.

    With Dynamo's frame hook off: a flush inside the eager part of a torch.compile'd function
    (between graph breaks) would have Dynamo try to compile every frame JAX calls outside the
    modules it skips (logging's, for one)."""
    hook = set_eval_frame(None)
    try:
        return _flush(cause, where)
    finally:
        set_eval_frame(hook)


def _flush(cause: str, where=None) -> list:
    """`flush` itself.

    Nothing an exception does here may leave a storage without its value. Signal handlers wait
    (interrupts.py); another exception that lands before the programs have consumed any input
    leaves the work pending as it was, and one that lands after them still puts their values in
    place (see `_interrupted`)."""
    if PENDING.garbage and cause not in ONE_OP and PENDING.graph.nodes and PENDING.graph.sources is None:
        # Dynamo's tracing leaves cycles holding a frame's real tensors, live as outputs of the first
        # step's program alone until the collector runs; a finalizer's op lands before g is read
        PENDING.garbage = False
        gc.collect()
    g = PENDING.graph
    # After these the op stream starts afresh. A host read (`.item()` every N steps) is part of a
    # loop's period, not a break in it: the heuristic keeps cutting in the same places, so the
    # read flushes the same tail every time.
    if cause in NEW_GRAPH or PENDING.cut_due is not None:  # the cut owed after a step is this one
        PENDING.period.reset()
        PENDING.cut_due = None
    if not g.nodes:
        return []
    if PENDING.flushing:
        raise RuntimeError("deferfuse internal error: re-entrant flush")
    for hook in PENDING.before_flush:
        hook()
    pushed = PENDING.pushed
    live: list = []
    refs: dict[int, int] = {}
    results = None
    # every signal handler waits from here to the end (interrupts.py): once a program has
    # consumed donated inputs, an exception from one would lose what it computed. If one raises
    # as the hold begins, for a signal already pending, nothing has changed yet.
    interrupts.hold()
    PENDING.flushing = True
    try:
        PENDING.graph = Graph()
        PENDING.pushed = 0
        t0 = time.perf_counter()
        live, refs = g.live_outputs()
        for s in live:
            s.graph = None  # marks it collected; restored below only on failure
        out_refs = tuple(refs)
        try:
            results, plan, hit = cache.execute(g, out_refs, cause, where, live, refs)
        except Exception as exc:  # noqa: BLE001 - re-raised with context below
            _recover(g, live, exc, cause, where)
            raise AssertionError("unreachable")
        for s in live:
            s.value = results[refs[s.ref]]
        if g.sources is not None:
            PENDING.captured = (g, out_refs, [(s, refs[s.ref]) for s in live], plan)
        counted(cause, where, len(g.nodes), len(out_refs), plan, hit, t0)
    except FlushError:
        raise
    except BaseException as exc:
        if results is not None:  # the programs ran: their values go in place
            for s in live:
                s.value = results[refs[s.ref]]
        else:
            _interrupted(g, pushed, exc, cause, where)
        raise
    finally:
        PENDING.flushing = False
        interrupts.release()  # the results are in place: the handlers of signals that came run now
    interrupts.deliver()
    return live


def counted(cause: str, where, n: int, n_out: int, plan, hit: bool, t0: float) -> None:
    """A flush of n nodes that began at t0 has run its plan: its metrics and its event."""
    m = METRICS
    m.flushes[cause] += 1
    m.nodes_flushed += n
    m.outputs_materialized += n_out
    m.bytes_materialized += plan.bytes_out
    m.intermediates_skipped += plan.n_internal
    m.bytes_skipped += plan.bytes_internal
    if n > m.max_pending:
        m.max_pending = n
    dt = time.perf_counter() - t0
    m.flush_seconds += dt
    if events.collecting() or CONFIG.log:
        events.emit(
            "flush", cause=cause, where=where, nodes=n, outputs=n_out, hit=hit, key=plan.key_hash,
            groups=len(plan.steps), seconds=dt, skipped=plan.n_internal, bytes_skipped=plan.bytes_internal,
            bytes_out=plan.bytes_out, ops=plan.n_ops,
        )


def _interrupted(g: Graph, pushed: int, exc: BaseException, cause: str, where) -> None:
    """An exception other than the flush's own failure landed before the flush had its results:
    one that no hold stops (SystemExit from a hook, MemoryError; signal handlers wait, see
    interrupts.py). If every input of the graph is still there, nothing was
    consumed and the work goes back to pending, as if the flush had not started. A program that
    donated an input has run, and its values are lost with the exception: the storages that were
    to receive them raise it, named, when read, rather than read as uninitialised memory."""
    waiting = [s for s in (w() for w in g.storages) if s is not None and (
        s.graph is g or s.graph is None and s.value is None and s.error is None)]
    consumed = any(isinstance(a, jax.Array) and a.is_deleted() for a in g.inputs)
    # the graph may not have been swapped out yet (an exception from a signal handler as the flush began)
    if not consumed and (PENDING.graph is g or not PENDING.graph.nodes):
        for s in waiting:
            s.graph = g
        PENDING.graph, PENDING.pushed = g, pushed
        return
    error = FlushError(f"deferfuse: the flush ({cause} at {sources.fmt(where)}) was interrupted by "
                       f"{type(exc).__name__} after its programs had consumed their inputs: this value was lost")
    for s in waiting:
        s.graph = None
        s.error = error


def _recover(g: Graph, live: list, exc: Exception, cause: str, where) -> None:
    """Run the failed graph op by op, so the values before the failing op stay valid."""
    values: dict[int, object] = {-(i + 1): a for i, a in enumerate(g.inputs)}
    failed = None
    bad: set[int] = set()
    for idx, node in enumerate(g.nodes):
        base = idx << OUT_BITS
        if any(r in bad for r in node.inputs):
            bad.update(base | k for k in range(len(node.op.out_avals)))
            continue
        if node.op.family == "collective":
            # spmd_safe's collectives run only inside their program, on every rank at once: alone
            # here they would fail for that reason and hide the program's own error
            bad.update(base | k for k in range(len(node.op.out_avals)))
            if failed is None:
                failed = (node, exc)
            continue
        try:
            ins = [values[r] for r in node.inputs]
            scs = g.scalars[node.scalar_lo : node.scalar_lo + node.op.n_scalars]
            # a host (CPU fallback) op runs on concrete values, never under jit
            outs = node.op.fn(ins, scs) if node.op.host else cache.run_single(node.op, ins, scs)
            for k, o in enumerate(outs):
                values[base | k] = o
        except Exception as e:  # noqa: BLE001
            bad.update(base | k for k in range(len(node.op.out_avals)))
            if failed is None:
                failed = (node, e)
    node, err = failed if failed is not None else (g.nodes[-1], exc)
    msg = (
        f"deferfuse: flush ({cause} at {sources.fmt(where)}) failed in {node.op.name} "
        f"recorded at {sources.fmt(node.where)}: {type(err).__name__}: {err}"
    )
    error = _flush_error_like(type(err))(msg)
    error.__cause__ = err
    # Strict and Debug flush one op at a time: a tensor the failed op was writing keeps the value
    # it had, as on CPU. In a longer DeferAndFuse graph that value is unknown (earlier writes may
    # have succeeded), so the tensor carries the error instead.
    one_op = cause in ONE_OP
    for s in live:
        v = values.get(s.ref)
        if v is None and one_op and id(s) in g.prior:
            v = g.inputs[g.prior[id(s)]]
        if v is not None:
            s.value = v
        else:
            s.error = error
    raise error


_FLUSH_ERRORS: dict[type, type] = {}


def _flush_error_like(kind: type) -> type:
    """A FlushError that is also the failing op's own exception type, so that `except
    IndexError` catches an out-of-range index a CPU fallback found, as it would on CPU."""
    if issubclass(kind, FlushError) or not issubclass(kind, Exception) or issubclass(RuntimeError, kind):
        return FlushError
    t = _FLUSH_ERRORS.get(kind)
    if t is None:
        try:
            t = type("FlushError", (FlushError, kind), {"__module__": __name__})
        except TypeError:  # an exception type with a layout of its own
            t = FlushError
        _FLUSH_ERRORS[kind] = t
    return t


def block(storages, everything: bool = False) -> None:
    """Wait for these storages' values; with `everything`, for all dispatched programs too."""
    t0 = time.perf_counter()
    for s in storages:
        v = s.value
        if isinstance(v, jax.Array):
            v.block_until_ready()
    if everything and target.opened():  # a device not yet opened runs nothing: left unopened
        # as torch.cuda.synchronize waits for the whole stream, not only for what its own flush
        # produced: every array alive on the device's client (JAX runs programs asynchronously).
        # The client keeps that list itself; a reference per program output, kept here until
        # the next sync, would be an object per output for Python's GC to promote through the
        # steps of a loop that never syncs, and set off full collections of the process.
        for a in jax_device().client.live_arrays():
            if not a.is_deleted():  # the client lists none that a program consumed; this keeps it so
                a.block_until_ready()
        # and the programs whose outputs all died: a device runs its programs in order, so one
        # more program done means they are done, and their outputs' memory given back (a TPU
        # frees a dead array's buffer only once the program that makes it has run, and
        # `memory_allocated` after a sync would count it)
        _barrier().block_until_ready()
    METRICS.sync_wait_seconds += time.perf_counter() - t0


_BARRIER: list = []


def _barrier() -> jax.Array:
    if not _BARRIER:
        _BARRIER.append(target.jit(lambda: jnp.zeros((), jnp.int8)))
    return _BARRIER[0]()


def concrete(t: TpuTensor, cause: str, where=None):
    """t's logical value as a concrete jax.Array, flushing whatever it depends on."""
    st = t._st
    if st.error is not None:
        raise st.error
    if t._lay is None:
        if st.value is None:
            if st.graph is None:
                value_ref(PENDING.graph, st)
            flush(cause, where)
        if st.error is not None:
            raise st.error
        return st.value
    # a view: read it into a temporary storage that the flush materialises
    g = PENDING.graph
    size, _, dtype = LAYOUTS[t._lid]
    tmp = Storage(None, size, dtype)
    tmp.set_pending(g, tensor_ref(g, t))
    flush(cause, where)
    if tmp.error is not None:
        raise tmp.error
    return tmp.value

