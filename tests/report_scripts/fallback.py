"""An op without a lowering (cummax) runs on CPU: counted, warned about, reported by line."""
import torch

z = torch.tensor([3.0, 1.0, 2.0, 5.0]).to("tpu")
for step in range(2):  # a signature's first call runs at once, later ones are recorded
    values, indices = torch.cummax(z * 2, 0)  # MARK:fallback
    print(values.sum().item())
