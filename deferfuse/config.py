"""Every environment variable deferfuse reads is read here and nowhere else.

Keeping them in one place makes the engine's behaviour auditable: a user who wonders why a run
behaves differently can read this file and `deferfuse.config.CONFIG` and see every knob.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: expected one of true/1/false/0")


def _flag_or(name: str, default: bool, word: str) -> bool | str:
    """A flag that also takes one word for a third setting."""
    raw = os.environ.get(name)
    if raw is not None and raw.strip().lower() == word:
        return word
    return _flag(name, default)


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


def _cache_dir(name: str) -> str | None:
    raw = os.environ.get(name)
    if raw is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "deferfuse")
    # the words every switch takes for "off" turn it off; anything else is a folder
    return None if raw.strip().lower() in _FALSE else raw


def _str(name: str) -> str | None:
    raw = os.environ.get(name)
    return raw.strip() or None if raw is not None else None


def _set(name: str) -> frozenset[str]:
    raw = os.environ.get(name, "")
    return frozenset(p.strip().lower() for p in raw.split(",") if p.strip())


@dataclass
class Config:
    # TorchTPU-compatible mode switches; LAUNCH_BLOCKING wins over DEFER_AND_FUSE.
    launch_blocking: bool = field(default_factory=lambda: _flag("TORCH_TPU_LAUNCH_BLOCKING", False))
    defer_and_fuse: bool = field(default_factory=lambda: _flag("TORCH_TPU_DEFER_AND_FUSE", False))
    # Raise NotImplementedError instead of running an op without a lowering on CPU.
    no_cpu_fallback: bool = field(default_factory=lambda: _flag("DEFERFUSE_NO_CPU_FALLBACK", False))
    # Safety valve on the pending graph. The repeated-op heuristic normally cuts loops long
    # before this; the cap only bounds straight-line code without repetition. 4096 nodes keeps
    # a worst-case XLA compile on a 2-core CPU to seconds (compile time grows with nodes;
    # docs/performance.md) while being well above one GPT training step between repetitions.
    max_pending: int = field(default_factory=lambda: _int("DEFERFUSE_MAX_PENDING", 4096))
    # Repeated-op heuristic (executors/deferred.py): look back this many recorded ops for a
    # period. A tight loop (period below `fuse_block_ops` nodes) is cut once it has repeated
    # over `period_min_ops` ops, so short chains still fuse into one program; a long period (a
    # training step) where all that is pending repeats it, or once it has repeated over
    # `step_min_ops` nodes (above the backward pass of bench's 12-layer GPT).
    period_lookback: int = field(default_factory=lambda: _int("DEFERFUSE_PERIOD_LOOKBACK", 2048))
    period_min_ops: int = field(default_factory=lambda: _int("DEFERFUSE_PERIOD_MIN_OPS", 64))
    step_min_ops: int = field(default_factory=lambda: _int("DEFERFUSE_STEP_MIN_OPS", 1024))
    # The fuser gives each repetition of a block of at least `fuse_block_ops` ops (a layer) its
    # own program once it repeats `fuse_block_repeats` times, so identical layers share one
    # compiled executable and compile time stays flat with depth; 0 fuses a flush regardless.
    # Fewer repeats stay fused whole: splitting costs steady-state time (a GPT step as one
    # program per layer runs slower than fused whole), and a shallow model compiles fast.
    fuse_block_ops: int = field(default_factory=lambda: _int("DEFERFUSE_FUSE_BLOCK_OPS", 16))
    fuse_block_repeats: int = field(default_factory=lambda: _int("DEFERFUSE_FUSE_BLOCK_REPEATS", 6))
    # Let a flush's program reuse the buffers of inputs nothing else holds any more (the old
    # values of parameters and optimizer state an in-place update replaces) for its outputs:
    # no second copy of the state, no allocation in the call. Off only to bisect a problem.
    donate: bool = field(default_factory=lambda: _flag("DEFERFUSE_DONATE", True))
    # Ops per fused program before the fuser splits a group (compile time grows superlinearly).
    max_group_ops: int = field(default_factory=lambda: _int("DEFERFUSE_MAX_GROUP_OPS", 4096))
    # The data checks Debug makes (index ranges, class targets, integer divisors, one_hot's
    # classes: executors/data_checks.py) in Strict and DeferAndFuse too; each costs a sync.
    debug_checks: bool = field(default_factory=lambda: _flag("TORCH_TPU_ENABLE_DEBUG_CHECKS", False))
    # Debug mode's NaN/Inf check (executors/nonfinite.py): True raises where CPU's result is
    # finite and warns where it is not, "raise" raises on every NaN/Inf from finite inputs, False
    # turns it off.
    debug_nan_check: bool | str = field(default_factory=lambda: _flag_or("DEFERFUSE_DEBUG_NAN_CHECK", True, "raise"))
    # DeferAndFuse replays a training step from the trace of the step before (executors/replay.py)
    # rather than recording it again op by op; off to compare, or to bisect a problem.
    replay: bool = field(default_factory=lambda: _flag("DEFERFUSE_REPLAY", True))
    # Launch a replayed step's programs as the replay records their last nodes (cache/ahead.py),
    # so the device runs the step's first layers while the host records the rest. "auto": on an
    # accelerator; not on JAX's CPU backend, whose device is the host's own cores, where the
    # programs then slow the recording they would overlap (docs/performance.md).
    run_ahead: bool | str = field(default_factory=lambda: _flag_or("DEFERFUSE_RUN_AHEAD", "auto", "auto"))
    # The PRNG behind tpu random ops (rng.py), any JAX implementation's name. "auto": XLA's
    # RngBitGenerator ("rbg") on an accelerator, where it draws dropout's masks faster than
    # threefry (docs/performance.md); JAX's default (threefry) on its CPU backend, whose values
    # are then every backend's. Strict, Debug and DeferAndFuse draw the same numbers either way.
    prng: str = field(default_factory=lambda: _str("DEFERFUSE_PRNG") or "auto")
    # Record the user's file:line for every recorded op (used by errors and the report).
    source_lines: bool = field(default_factory=lambda: _flag("DEFERFUSE_SOURCE_LINES", True))
    # Live event log, like TORCH_LOGS: any of flush, compile, fallback, all.
    log: frozenset[str] = field(default_factory=lambda: _set("DEFERFUSE_LOG"))
    # Collect report events from import on, so `deferfuse.report()` works without code changes.
    report: bool = field(default_factory=lambda: _flag("DEFERFUSE_REPORT", False))
    # The persistent compile cache (persistent.py): on by default under the user's cache folder
    # ($XDG_CACHE_HOME/deferfuse or ~/.cache/deferfuse); a path puts it there; empty or 0 turns it off.
    cache_dir: str | None = field(default_factory=lambda: _cache_dir("DEFERFUSE_CACHE_DIR"))
    # Its size cap in MB: past it the least recently used programs are evicted.
    cache_max_mb: int = field(default_factory=lambda: _int("DEFERFUSE_CACHE_MAX_MB", 2048))
    # Trace every program loaded from deferfuse's own store anyway and raise if it differs from the
    # one stored (cache/stored.py): what the tests run to prove the store's keys complete.
    cache_verify: bool = field(default_factory=lambda: _flag("DEFERFUSE_CACHE_VERIFY", False))
    # Optimisation fuel: at most this many ops may be fused into programs with others; the rest
    # run one op per program. Bisecting on it isolates a fusion that changes a result.
    fusion_fuel: int | None = field(
        default_factory=lambda: _int("DEFERFUSE_FUSION_FUEL", -1) if "DEFERFUSE_FUSION_FUEL" in os.environ else None
    )

    # --- several processes (cluster.py, distributed/) --------------------------------------
    # Who this process is, as torchrun (or any launcher following its env:// convention) says.
    rank: int = field(default_factory=lambda: _int("RANK", 0))
    world_size: int = field(default_factory=lambda: _int("WORLD_SIZE", 1))
    local_rank: int = field(default_factory=lambda: _int("LOCAL_RANK", 0))
    local_world_size: int = field(default_factory=lambda: _int("LOCAL_WORLD_SIZE", 1))
    master_addr: str | None = field(default_factory=lambda: _str("MASTER_ADDR"))
    master_port: int = field(default_factory=lambda: _int("MASTER_PORT", 0))
    # torchrun's agent hosts a store at MASTER_ADDR:MASTER_PORT its workers may join at once;
    # rank 0 publishes JAX's coordinator address there. The run id and restart count keep a
    # restarted job from reading an old address.
    agent_store: bool = field(default_factory=lambda: _flag("TORCHELASTIC_USE_AGENT_STORE", False))
    run_id: str = field(default_factory=lambda: _str("TORCHELASTIC_RUN_ID") or "")
    restart_count: int = field(default_factory=lambda: _int("TORCHELASTIC_RESTART_COUNT", 0))
    # host:port for JAX's coordination service, where the launcher provides no store.
    coordinator: str | None = field(default_factory=lambda: _str("DEFERFUSE_COORDINATOR"))
    # Seconds a process waits for its peers at the runtime's start, and JAX's heartbeat timeout
    # (a collective's rendezvous waits for the group's init_process_group(timeout=...)).
    dist_timeout: int = field(default_factory=lambda: _int("DEFERFUSE_DIST_TIMEOUT", 300))
    # Ranks meet in the store before each collective (distributed/rendezvous.py), so a dead or
    # diverged peer is an error naming it rather than a hang; 0 skips the meeting.
    dist_check: bool = field(default_factory=lambda: _flag("DEFERFUSE_DIST_CHECK", True))


CONFIG = Config()
