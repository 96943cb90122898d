"""Train the example GPT with its parameters sharded across processes by FSDP2 (`fully_shard`).

    torchrun --nproc_per_node=2 examples/fsdp_train.py --mode defer_and_fuse --steps 20

The same script as ddp_train.py with each transformer block and the whole model wrapped in
`fully_shard` instead of DDP: each rank holds half of every parameter and of the optimizer
state, and gathers a block's weights just before using them.
"""
from __future__ import annotations

import ddp_train

if __name__ == "__main__":
    ddp_train.main("fsdp")
