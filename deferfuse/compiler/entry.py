"""The `torch_dynamo_backends` entry point: Dynamo loads `tpu` from here and registers it itself
(importing the backend module teaches Dynamo about tpu tensors)."""
from __future__ import annotations

from .backend import tpu

__all__ = ["tpu"]
