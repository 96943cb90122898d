"""The persistent compile cache (tier 3): compiled programs kept on disk across processes.

A process compiles every program it meets anew, and on our machines that is most of a short
run's time (the GPT demo: about two thirds of it). JAX's own persistent compilation cache keeps
each executable on disk under a hash of the whole program, the backend and its version, the
compile options and XLA's flags; deferfuse turns it on by default, as a user expects of a JIT
whose compiles take seconds, and keeps its own programs in the same folder under its own keys
(cache/stored.py), which a warm run finds without tracing:

- under `$XDG_CACHE_HOME/deferfuse` or `~/.cache/deferfuse` (DEFERFUSE_CACHE_DIR elsewhere; empty
  or 0 turns it off), in a folder per jax, jaxlib and deferfuse version, so an upgrade never even
  looks at an older one's entries;
- capped (DEFERFUSE_CACHE_MAX_MB), least recently used entries evicted first;
- safe with several processes writing at once (torchrun, pytest-xdist) and with Ctrl-C at any
  moment: an entry is written to a file of its own and renamed into place, so a reader sees all
  of it or none, and nothing is locked. (JAX's own capped store takes a file lock around every
  read and write, and an interrupt landing inside the lock's bookkeeping left the next compile
  of the process waiting on itself forever; so deferfuse puts its own store in its place);
- a corrupt or truncated entry is skipped with JAX's warning and the program is compiled again;
- every program is written, however fast its compile (JAX's default keeps only those over 1 s,
  and a training step is hundreds of small ones).

Security: a cached executable is code this process runs, so anyone who can write the cache
folder can make it run theirs. The folder is created private (0700), and a folder that is not
the user's own, or that others may write, is not used.
"""
from __future__ import annotations

import os
import pathlib
import stat
import time
import uuid
import warnings
from importlib import metadata

import jax
import jaxlib

from jax._src import compilation_cache as jcc  # private: JAX has no public hook for a store of one's own
from jax._src.compilation_cache_interface import CacheInterface

from .config import CONFIG
from .events import METRICS

_HITS = "/jax/compilation_cache/cache_hits"
_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def _version() -> str:
    try:
        return metadata.version("deferfuse")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return "source"


def folder(root: str) -> str:
    return os.path.join(root, f"jax-{jax.__version__}-jaxlib-{jaxlib.__version__}-deferfuse-{_version()}")


def _private(path: str) -> bool:
    st = os.stat(path)
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def configure() -> str | None:
    """Turn the cache on as CONFIG says; returns its folder, or None when it is off."""
    _listen_compiles()
    _STORE.clear()
    root = CONFIG.cache_dir
    if not root:
        return None
    path = folder(root)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        bad = next((p for p in (root, path) if not _private(p)), None)
    except OSError as err:
        warnings.warn(f"deferfuse: the persistent compile cache is off: cannot use {path}: {err}")
        return None
    if bad is not None:
        warnings.warn(f"deferfuse: the persistent compile cache is off: {bad} is not private to this user (anyone "
                      "who can write it could make this process run their code); use a folder of your own "
                      "(DEFERFUSE_CACHE_DIR) with permissions 0700")
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    _install(Store(path, CONFIG.cache_max_mb << 20))
    _listen()
    return path


def _install(store: "Store") -> None:
    """Make `store` the cache JAX reads and writes (its module-level slot; JAX fills it with its
    own LRUCache on first use otherwise), and the one deferfuse keeps its own programs in."""
    with jcc._cache_initialized_mutex:
        jcc._cache = store
        jcc._cache_initialized = True
    _STORE[:] = [store]


def store() -> "Store | None":
    """The folder's store while the cache is on (configure), else None."""
    return _STORE[0] if _STORE else None


_STORE: list = []


class Store(CacheInterface):
    """Entries as files `<key>-cache`, written whole under another name and renamed into place;
    a read marks an entry used (its mtime), and past the cap the least recently used go."""

    def __init__(self, path: str, max_bytes: int):
        self._path = pathlib.Path(path)
        self.max_bytes = max_bytes
        self.size: int | None = None  # what this process knows the folder holds

    def get(self, key: str) -> bytes | None:
        entry = self._path / f"{key}-cache"
        try:
            value = entry.read_bytes()
            os.utime(entry)
        except FileNotFoundError:  # never written, or evicted by another process meanwhile
            return None
        return value

    def put(self, key: str, value: bytes) -> None:
        entry = self._path / f"{key}-cache"
        if entry.exists() or len(value) > self.max_bytes:
            return
        part = self._path / f".{key}.{uuid.uuid4().hex}.part"
        try:
            part.write_bytes(value)
            os.replace(part, entry)
        finally:
            part.unlink(missing_ok=True)
        if self.size is None:
            self.size = self._scan()[0]
        self.size += len(value)
        if self.size > self.max_bytes:
            self._evict()

    def _scan(self) -> tuple[int, list]:
        entries, total, stale = [], 0, time.time() - 3600
        for p in self._path.iterdir():
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            if p.name.endswith("-cache"):
                entries.append((st.st_mtime, st.st_size, p))
                total += st.st_size
            elif p.name.endswith(".part") and st.st_mtime < stale:  # a write interrupted long ago
                p.unlink(missing_ok=True)
        return total, entries

    def _evict(self) -> None:
        """Down to nine tenths of the cap, oldest use first (other processes' entries count too)."""
        total, entries = self._scan()
        for _, size, p in sorted(entries):
            if total <= self.max_bytes * 9 // 10:
                break
            p.unlink(missing_ok=True)
            total -= size
        self.size = total


_LISTENING = []
_COMPILES = []


def _listen_compiles() -> None:
    """Sum XLA's backend compiles into `xla_compile_seconds` and count them in `xla_compiles`,
    cache on or off: what a program loaded from the persistent cache does not pay, where
    `compile_seconds` also counts the tracing and lowering JAX needs to find it."""
    if _COMPILES:
        return
    _COMPILES.append(True)

    def on_duration(event: str, duration: float, **_) -> None:
        if event == _BACKEND_COMPILE:
            METRICS.xla_compile_seconds += duration
            METRICS.xla_compiles += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)


def _listen() -> None:
    """Count JAX's persistent-cache lookups into deferfuse's metrics (the report shows them
    beside the in-process cache's)."""
    if _LISTENING:
        return
    _LISTENING.append(True)

    def on_event(event: str, **_) -> None:
        if event == _REQUESTS:
            METRICS.persistent_lookups += 1
        elif event == _HITS:
            METRICS.persistent_hits += 1

    jax.monitoring.register_event_listener(on_event)
