"""One flush per sync-point cause, each on a line marked `# MARK:<cause>` (tests/test_report.py
finds the line numbers by these markers). Run under deferfuse-report, whose default mode is
DeferAndFuse, so no `with deferfuse.mode()` is needed."""
import torch

import deferfuse

x = torch.arange(6.0).to("tpu")
y = x + 1
y.sum().item()  # MARK:item
print(x * 2)  # MARK:print
(x - 1).cpu()  # MARK:to_cpu
(x + 5).tolist()  # MARK:tolist
if (x > 0).any():  # MARK:bool
    pass
z = (x * 3)[x > 2]  # MARK:data_dependent
w = z * 4
deferfuse.sync()  # MARK:sync
# exp and the product die inside the flush: intermediates that are never materialised
(x.exp() * 2 + 1).sum().item()  # MARK:dead
