"""`python -m deferfuse.distributed`: what this process would run as, and what a launcher sets.

Prints the launcher's variables deferfuse reads, the coordinator JAX would use, and the
devices JAX sees here (starting nothing multi-process), as TorchTPU's
`python -m torch.tpu.distributed` does.
"""
from __future__ import annotations

import jax

from ..config import CONFIG

_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_USE_AGENT_STORE", "DEFERFUSE_COORDINATOR", "DEFERFUSE_DIST_TIMEOUT", "DEFERFUSE_DIST_CHECK")


def main() -> None:
    c = CONFIG
    print(f"rank {c.rank} of {c.world_size} (local rank {c.local_rank} of {c.local_world_size})")
    for name, value in zip(_VARS, (c.rank, c.world_size, c.local_rank, c.local_world_size, c.master_addr,
                                   c.master_port, c.agent_store, c.coordinator, c.dist_timeout, c.dist_check)):
        print(f"  {name:30} {value}")
    if c.world_size > 1:
        how = ("published by rank 0 in torchrun's agent store" if c.agent_store and not c.coordinator
               else c.coordinator or f"{c.master_addr}:{c.master_port + 1}")
        print(f"JAX coordinator: {how}")
        print("devices: known once the runtime starts (in the job itself)")
        return
    print(f"JAX {jax.__version__}, backend {jax.default_backend()}: {len(jax.devices())} device(s) here "
          f"{[str(d) for d in jax.devices()]}")
    print("launch: torchrun --nproc_per_node=N script.py  (one process per device; docs/distributed.md)")


if __name__ == "__main__":
    main()
