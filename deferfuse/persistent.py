"""The persistent compile cache (tier 3): compiled programs kept on disk across processes.

A process compiles every program it meets anew, and on our machines that is most of a short
run's time (the GPT demo: about two thirds of it). JAX's own persistent compilation cache keeps
each executable on disk under a hash of the whole program, the backend and its version, the
compile options and XLA's flags; deferfuse turns it on by default, as a user expects of a JIT
whose compiles take seconds:

- under `$XDG_CACHE_HOME/deferfuse` or `~/.cache/deferfuse` (DEFERFUSE_CACHE_DIR elsewhere; empty
  or 0 turns it off), in a folder per jax, jaxlib and deferfuse version, so an upgrade never even
  looks at an older one's entries;
- capped (DEFERFUSE_CACHE_MAX_MB), least recently used entries evicted first. The cap also turns
  on JAX's file lock around every read and write, which makes several processes writing at once
  (torchrun, pytest-xdist) safe;
- a corrupt or truncated entry is skipped with JAX's warning and the program is compiled again;
- every program is written, however fast its compile (JAX's default keeps only those over 1 s,
  and a training step is hundreds of small ones).

Security: a cached executable is code this process runs, so anyone who can write the cache
folder can make it run theirs. The folder is created private (0700), and a folder that is not
the user's own, or that others may write, is not used.
"""
from __future__ import annotations

import os
import stat
import warnings
from importlib import metadata

import jax
import jaxlib

from .config import CONFIG
from .events import METRICS

_HITS = "/jax/compilation_cache/cache_hits"
_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"


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
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", CONFIG.cache_max_mb << 20)
    _listen()
    return path


_LISTENING = []


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
