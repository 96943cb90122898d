"""Programs kept on disk under deferfuse's own key, so that a warm run neither traces nor lowers.

JAX's persistent cache (persistent.py) finds an executable by a hash of the lowered program, so
even a hit costs the trace and the lowering: on our machines about three quarters of a warm run's
time to its first step, on a TPU host seconds per program (docs/performance.md). Deferfuse knows
what a program computes before it traces it, from the key its in-process cache already uses: the
group's structure, each op's interned key, the inputs' avals, the scalar layout and the donated
inputs. Read back into values (interned.py: a layout id as its size, stride and dtype, an
overload id as its name), that key names the program across processes too, once it is joined by
everything outside it that a trace reads: the versions of deferfuse's source, torch, JAX and
jaxlib, the device, JAX's flags, XLA's and deferfuse's settings.

A key holding a value this module cannot read back (a function, a program with collectives) is
not stored: its programs go through JAX's cache as before. A graph torch.compile made is an op
whose key holds its nodes' op ids: it is spelled with those ops' own tokens. A stored entry also
keeps a hash of its lowered program, and `DEFERFUSE_CACHE_VERIFY=1` traces every program it loads
and raises if the two differ: the tests run their workloads twice that way, so a key that leaves
something out fails a test, not a user's run.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import pickle
import warnings
from typing import Callable

import jax
import jaxlib
import numpy as np
import torch
from jax.experimental import serialize_executable

from .. import persistent
from ..config import CONFIG
from ..events import METRICS
from ..graph import Op
from ..interned import FUNCS, LAYOUTS, FuncId, LayoutId
from ..target import jax_device, platform

_FORMAT = b"deferfuse-program-1"
_PREFIX = "deferfuse-"
# deferfuse's settings that decide nothing a trace makes (logging, where and how much to cache,
# how several processes meet); every other one is part of the key
_NOT_IN_KEY = frozenset({"log", "report", "cache_dir", "cache_max_mb", "cache_verify", "master_addr", "master_port",
                         "run_id", "restart_count", "coordinator", "dist_timeout", "agent_store", "dist_check"})


class DifferentProgram(AssertionError):
    """A loaded program is not the one a trace makes (DEFERFUSE_CACHE_VERIFY=1): its key misses
    something the trace depends on."""


# --- the key -----------------------------------------------------------------------------------

_SIMPLE = (torch.dtype, torch.device, torch.memory_format, torch.layout)
_NUMBER_TYPES = {int: "int", float: "float", bool: "bool", complex: "complex"}


def _canon(x, out: list) -> bool:
    """Append a process-independent spelling of x to out; False where there is none."""
    t = type(x)
    if x is None or t is bool or t is int or t is str:
        out.append(repr(x))
    elif t is float:
        out.append(x.hex())
    elif t is LayoutId:
        out.append("L")
        return _canon(LAYOUTS[x], out)
    elif t is FuncId:
        name = str(FUNCS[x])
        if " at 0x" in name:
            return False
        out.append("F" + name)
    elif t is tuple or t is list:
        out.append("(" if t is tuple else "[")
        for y in x:
            if not _canon(y, out):
                return False
        out.append(")")
    elif t is complex:
        out.append(f"c{x.real.hex()},{x.imag.hex()}")
    elif t in _SIMPLE:
        out.append(repr(x))
    elif isinstance(x, np.dtype):
        out.append("np." + x.name)  # a name: `str` spells every float8 type "<V1"
    elif t is type and x in _NUMBER_TYPES:  # a Python number's type in a signature: float, int
        out.append("type " + _NUMBER_TYPES[x])
    else:  # an OpId, a function, anything whose value this process alone knows
        return False
    return True


_OP_TOKENS: dict[Op, str | None] = {}


def op_token(op: Op) -> str | None:
    """What an op computes, as a string that means the same in every process (None: no such)."""
    try:
        return _OP_TOKENS[op]
    except KeyError:
        pass
    out: list[str] = [op.name, op.family, str(op.n_scalars), str(op.host), repr(op.precision)]
    key_spelled = _canon_graph(op.key, out) if op.family == "compiled" else _canon(op.key, out)
    ok = op.portable and key_spelled and _canon([(tuple(s), np.dtype(d)) for s, d in op.out_avals], out)
    _OP_TOKENS[op] = token = "\x1f".join(out) if ok else None
    return token


def _canon_graph(key: tuple, out: list) -> bool:
    """A graph torch.compile made (compiler/graphs.py `_graph_op`): its key holds each node's op
    id, which only this process can read; each is spelled as that op's own token instead."""
    tag, sig, *rest = key
    out.append(tag)
    for op_id, refs in sig:
        inner = Op.of_id(op_id)
        token = op_token(inner) if inner is not None else None
        if token is None or not _canon(refs, out):
            return False
        out.append(token)
    return _canon(tuple(rest), out)


def program_key(nodes, group_nodes, key: tuple, layout) -> str | None:
    """The stored name of the group program of `group_nodes` (indices into `nodes`) whose
    in-process key is `key` (cache.group_key), or None when one of its ops has no
    process-independent token."""
    rel_sig, outs, avals = key
    parts: list = [_environment(), _flags()]
    for i, (_, refs) in zip(group_nodes, rel_sig):
        token = op_token(nodes[i].op)
        if token is None:
            return None
        parts.append(token)
        parts.append(repr(refs))
    spelled: list[str] = []
    if not (_canon(outs, spelled) and _canon([(tuple(s), _dtype_name(d)) for s, d in avals], spelled)
            and _canon(layout, spelled)):
        return None
    parts.extend(spelled)
    return hashlib.sha256("\x1e".join(parts).encode()).hexdigest()


def variant_name(name: str, give: tuple, order: tuple) -> str:
    """The stored name of program `name` donating the inputs at `give`, its outputs in `order`."""
    return hashlib.sha256(f"{name} {give} {order}".encode()).hexdigest()


def _dtype_name(d) -> str:
    return str(d) if isinstance(d, torch.dtype) else np.dtype(d).name


@functools.cache
def _environment() -> str:
    """What a process cannot change while it runs that decides what tracing a program makes."""
    dev = jax_device()
    return "\x1d".join(map(str, (
        _FORMAT, _source_digest(), torch.__version__, jax.__version__, jaxlib.__version__, np.__version__,
        dev.platform, dev.device_kind, dev.id, jax.process_index(), jax.process_count(),
        os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""),
    )))


def _flags() -> str:
    """What may change while a process runs, read at each program's build: JAX's flags (x64,
    the default matmul precision, the PRNG; `jax.config.update` at any time) and deferfuse's
    settings."""
    settings = [(f.name, getattr(CONFIG, f.name)) for f in dataclasses.fields(CONFIG) if f.name not in _NOT_IN_KEY]
    flags = sorted((k, repr(v)) for k, v in jax.config.values.items() if k != "jax_compilation_cache_dir")
    return repr((settings, flags))


def _source_digest() -> str:
    """deferfuse's own source, every file of it: lowerings, decompositions, the program builder."""
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


# --- the store ---------------------------------------------------------------------------------


def executable(name: str | None, jitted, args: tuple) -> Callable:
    """What runs the program `jitted` called on `args`: its executable loaded from the store under
    `name`, or compiled now (through JAX's persistent cache) and stored there; with no name, or
    no store, only compiled (ahead of time, so that every program runs the same way)."""
    store = persistent.store() if name is not None else None
    entry = _PREFIX + name if store is not None else ""
    raw = store.get(entry) if store is not None else None
    if raw is not None:
        loaded = _load(raw, name)
        if loaded is not None:  # counted as JAX's cache counts a hit; a miss goes on to JAX's lookup
            exe, digest = loaded
            METRICS.persistent_lookups += 1
            METRICS.persistent_hits += 1
            METRICS.programs_loaded += 1
            if CONFIG.cache_verify:
                _verify(jitted, args, digest, name)
            return exe
    lowered = jitted.lower(*args)
    hits = METRICS.persistent_hits
    compiled = lowered.compile()
    # One JAX's cache loaded (a program another source version stored, or one of another key that
    # lowers alike) is stored again only where that works: XLA:CPU cannot serialize a loaded
    # executable (UNIMPLEMENTED, or one that comes back without its nested functions, "Function
    # wrapped_or not found" when it runs); XLA:TPU's comes back whole. Not stored, it is traced and
    # lowered at every warm run after a change to deferfuse's source.
    if store is not None and (METRICS.persistent_hits == hits or platform() == "tpu"):
        _save(store, entry, compiled, lowered)
    return compiled


def _load(raw: bytes, name: str):
    try:
        fmt, payload, in_tree, out_tree, digest = pickle.loads(raw)
        if fmt != _FORMAT:
            return None
        dev = jax_device()
        exe = serialize_executable.deserialize_and_load(payload, in_tree, out_tree, backend=dev.client,
                                                        execution_devices=[dev])
    except Exception as err:  # noqa: BLE001 - a truncated or foreign entry: compile instead
        warnings.warn(f"deferfuse: could not load the stored program {name[:16]}… ({type(err).__name__}: {err}); "
                      "compiling it again")
        return None
    return exe, digest


def _save(store, entry: str, compiled, lowered) -> None:
    try:
        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        raw = pickle.dumps((_FORMAT, payload, in_tree, out_tree, _digest(lowered)))
    except Exception:  # noqa: BLE001 - a program JAX cannot serialize: JAX's own cache still has it
        return
    store.put(entry, raw)


def _digest(lowered) -> str:
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def _verify(jitted, args: tuple, digest: str, name: str) -> None:
    now = _digest(jitted.lower(*args))
    if now != digest:
        raise DifferentProgram(f"deferfuse: the stored program {name} is not the one tracing makes now: its key "
                               "leaves out something the trace depends on")

