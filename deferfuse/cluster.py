"""Several processes, one device each: JAX's own multi-controller runtime, started for the user.

`jax.distributed.initialize` must run before JAX first touches a backend in the process, and
user scripts move their model to "tpu" before they call `init_process_group`. So the runtime
starts here, lazily, at deferfuse's first use of a device (`target.jax_device`), from the
launcher's environment (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):

- JAX's coordination service needs an address of its own. Under torchrun, rank 0 picks a free
  port on MASTER_ADDR's host and publishes it in the agent's store (which every worker may join
  at once, before `init_process_group`); the others read it there. Without an agent store,
  DEFERFUSE_COORDINATOR names it, else MASTER_PORT + 1 on MASTER_ADDR.
- On a host with several devices, each process makes only the one its LOCAL_RANK names visible
  (JAX's `local_device_ids`), so `tpu:0` is this process's own device, as CUDA code sees its
  GPU under CUDA_VISIBLE_DEVICES. JAX's CPU backend has one device per process and ignores it.
- A dead peer is noticed by JAX's heartbeats after the same timeout as a collective's
  rendezvous (DEFERFUSE_DIST_TIMEOUT), not JAX's 100 s.
- SIGTERM ends a process, as torchrun expects when it stops a job: JAX's preemption service,
  which would catch it, is off.

A process started some other way, or by a user who called `jax.distributed.initialize`
themselves, keeps what it has.
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
from datetime import timedelta

import jax
from torch.distributed import TCPStore

from .config import CONFIG

_STARTED = False
_PEER_FAILED = False


def multi_process() -> bool:
    """Whether the launcher started this process as one of several."""
    return CONFIG.world_size > 1


def start(store=None, rank: int | None = None, size: int | None = None) -> None:
    """Start JAX's multi-process runtime, once, if the launcher asked for several processes.

    `init_process_group` passes its store, rank and size: a job started without torchrun's
    environment (`mp.spawn`, an explicit `init_method`) starts the runtime there, if no device
    was used before; rank 0 publishes the coordinator's address in that store."""
    global _STARTED
    if _STARTED:
        if store is not None and size and size > 1 and not jax.distributed.is_initialized():
            raise RuntimeError(
                f"deferfuse: init_process_group for {size} processes after this process used its tpu device "
                "alone: launch with torchrun (its environment starts JAX's multi-process runtime at the first "
                "device use), or call init_process_group before the first tpu tensor")
        return
    _STARTED = True
    if jax.distributed.is_initialized():
        return
    if multi_process():
        rank, size, address = CONFIG.rank, CONFIG.world_size, coordinator_address()
    elif store is not None and size and size > 1:
        address = _published(store, rank == 0, "")
    else:
        return
    ids = [CONFIG.local_rank] if CONFIG.local_world_size > 1 else None
    # JAX's preemption service takes SIGTERM for a notice to poll at a sync point, and the process
    # lives on; torchrun sends SIGTERM to stop the other workers when one fails, and SIGKILLs them
    # only 30 s later. Without the service SIGTERM ends the process, as in any PyTorch job.
    jax.config.update("jax_enable_preemption_service", False)
    try:
        jax.distributed.initialize(
            address, num_processes=size, process_id=rank,
            local_device_ids=ids, initialization_timeout=CONFIG.dist_timeout,
            heartbeat_timeout_seconds=CONFIG.dist_timeout, shutdown_timeout_seconds=CONFIG.dist_timeout)
        atexit.register(_exit_if_failed)  # runs before JAX's own shutdown (atexit is LIFO)
    except RuntimeError as e:
        raise RuntimeError(
            f"deferfuse: could not start JAX's multi-process runtime for rank {rank} of "
            f"{size}: {e}. It has to start before anything else in the process uses "
            "JAX; deferfuse starts it at its first use of the tpu device.") from e


def peer_failed() -> None:
    """A peer is dead, stuck or diverged (distributed/rendezvous.py raised): at exit, do not wait
    for it in JAX's shutdown barrier, which would hold this process until the timeout."""
    global _PEER_FAILED
    _PEER_FAILED = True


def _exit_if_failed() -> None:
    """A process that failed exits with status 1 without waiting for its peers in JAX's shutdown
    barrier: they may be waiting for it in a collective, so the barrier would hold it until
    DEFERFUSE_DIST_TIMEOUT, and torchrun stops a job only once a worker has exited. It failed if a
    peer did (peer_failed), or if an exception ended the program: the interpreter records that one
    in `sys.last_value` (`sys.last_exc` from 3.12) as it prints it, before the atexit handlers run.

    The handlers registered before the runtime started (JAX's shutdown among them) do not run;
    logging's does, so no record is lost. A clean exit keeps JAX's clean shutdown."""
    if _PEER_FAILED or getattr(sys, "last_exc", getattr(sys, "last_value", None)) is not None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def coordinator_address() -> str:
    if CONFIG.coordinator:
        return CONFIG.coordinator
    if not CONFIG.master_addr:
        raise RuntimeError(f"deferfuse: WORLD_SIZE={CONFIG.world_size} but no MASTER_ADDR: launch with torchrun, "
                           "or set DEFERFUSE_COORDINATOR=host:port for JAX's coordination service")
    if not CONFIG.agent_store:
        return f"{CONFIG.master_addr}:{CONFIG.master_port + 1}"
    store = TCPStore(CONFIG.master_addr, CONFIG.master_port, is_master=False,
                     timeout=timedelta(seconds=CONFIG.dist_timeout), wait_for_workers=False)
    return _published(store, CONFIG.rank == 0, f"/{CONFIG.run_id}/{CONFIG.restart_count}", CONFIG.master_addr)


def _published(store, first: bool, suffix: str, host: str | None = None) -> str:
    """Rank 0 picks the coordinator's address and sets it in the store; the others read it."""
    key = "deferfuse/jax_coordinator" + suffix
    if first:
        address = f"{host or socket.gethostname()}:{_free_port()}"
        store.set(key, address)
        return address
    return store.get(key).decode()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
