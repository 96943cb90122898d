"""Train the example GPT data-parallel: one process per device, PyTorch's own DDP.

    torchrun --nproc_per_node=2 examples/ddp_train.py --mode defer_and_fuse --steps 20

What changes from gpt_train.py is what changes for CUDA: `init_process_group()` (on tpu its
default backend is deferfuse's "tpu_dist"; `--mode cpu` uses gloo), the model wrapped in
`DistributedDataParallel`, and each rank reading its own batches. fsdp_train.py shards the
model with FSDP2 instead.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import loop
from gpt_train import GPT, GPTConfig, batches


def train(wrap: str, mode: str, steps: int, cfg: GPTConfig, batch: int, log_every: int) -> list[float]:
    dist.init_process_group("gloo" if mode == "cpu" else None)
    rank = dist.get_rank()
    device = loop.device_for(mode)  # the same seed on every rank: the same initial weights
    model = GPT(cfg).to(device)
    if wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # the mesh names the device type: FSDP2's default would be the accelerator even for --mode cpu
        mesh = init_device_mesh(device, (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def loss_of(logits, y):
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    losses = loop.run(mode, steps, model, opt, batches(cfg, batch, seed=1234 + rank), loss_of,
                      log_every=log_every, quiet=rank != 0, fmt=".4f")
    dist.destroy_process_group()
    return losses


def main(wrap: str = "ddp", argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="defer_and_fuse", choices=loop.MODES)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--log-every", type=int, default=5)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    train(wrap, args.mode, args.steps, GPTConfig(layers=args.layers, dim=args.dim), args.batch, args.log_every)
    if os.environ.get("RANK", "0") == "0":
        loop.summary(f"{args.mode}, {wrap}", args.steps, t0)


if __name__ == "__main__":
    main("ddp")
