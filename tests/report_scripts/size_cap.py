"""Straight-line work past the pending-node cap (run with DEFERFUSE_MAX_PENDING=8)."""
import torch

x = torch.ones(4).to("tpu")
for i in range(30):
    x = x * 1.01 + i  # MARK:size_cap
print(x.sum().item())
