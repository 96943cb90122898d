"""Claims of composite ATen ops for "tpu" tensors at their autograd key, so that a common layer
records one node forward and one backward instead of PyTorch's expansion (`linear`, attention).
Importing this package registers them.
"""
from . import attention, linear  # noqa: F401
