"""A loop whose input shape changes every step: every flush compiles a new program."""
import torch

for n in range(2, 9):
    x = torch.ones(n).to("tpu")
    (x * 2).sum().item()  # MARK:recompile
