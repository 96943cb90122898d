"""The `torch_dynamo_backends` entry point: Dynamo loads `tpu` from here and registers it itself."""
from __future__ import annotations

from .backend import dynamo, tpu  # noqa: F401  (importing backend teaches Dynamo about tpu tensors)

dynamo.teach()
